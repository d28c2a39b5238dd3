package main

import "github.com/urfave/cli/v3"

func eventsCommand() *cli.Command {
	return &cli.Command{Name: "events", Usage: "subscribe to a pod's KV events and print them", OnUsageError: onUsageError}
}
