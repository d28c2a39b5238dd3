package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/peers"
)

// peerKeygenCommand writes a new --peer-key-file.
func peerKeygenCommand() *cli.Command {
	out := "-"
	t := newFlagTable("peer-keygen")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "peer-keygen",
		Usage: "write a new CURVE keypair for the router replicas' --peer-key-file",
		Description: "Writes one keypair, as public=Z85 and secret=Z85 lines, for every replica of one deployment\n" +
			"to share as --peer-key-file (a Kubernetes Secret: kubectl create secret generic prefixrouter-peer-key\n" +
			"--from-file=peer.key=FILE). A file is created with mode 0600 and never overwritten.",
		Flags: []cli.Flag{
			b.str("out", "the key file to create; - writes standard output", &out),
		},
		Action: func(_ context.Context, cmd *cli.Command) error { return runPeerKeygen(cmd.Root().Writer, out) },
	})
}

func runPeerKeygen(stdout io.Writer, out string) error {
	k, err := peers.GenerateKey()
	if err != nil {
		return err
	}
	if out == "-" {
		_, err := stdout.Write(k.Format())
		return err
	}
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return usageError("--out %s exists: a key is never overwritten (the replicas holding it would be shut out)", out)
	}
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	if _, err := f.Write(k.Format()); err != nil {
		f.Close()
		return fmt.Errorf("--out %s: %w", out, err)
	}
	return f.Close()
}
