package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/target"
)

func eventsCommand() *cli.Command {
	return &cli.Command{
		Name:  "events",
		Usage: "subscribe to a pod's KV-cache events and print them as JSON lines",
		Description: "The wiring check to run before anything else: connects to a vLLM pod's KV-event\n" +
			"publisher (--kv-events-config endpoint), prints one JSON object per event, recovers\n" +
			"sequence gaps through the replay socket when --replay is given, and ends with a summary line.",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "endpoint", Usage: "the pod's event publisher, tcp://HOST:PORT (required)", Sources: envVar("events-endpoint")},
			&cli.StringFlag{Name: "replay", Usage: "the pod's replay socket, tcp://HOST:PORT", Sources: envVar("events-replay")},
			&cli.StringFlag{Name: "topic", Usage: "topic prefix to subscribe to (default: every topic)", Sources: envVar("events-topic")},
			&cli.StringFlag{Name: "count", Usage: "exit after printing this many events (0: no limit)", Value: "0"},
			&cli.StringFlag{Name: "timeout", Usage: "exit after this long, e.g. 30s (0: no limit)", Value: "0"},
		},
		Action: runEvents,
	}
}

// eventLine is one printed event. Hashes are decimal strings of their uint64
// wire value so that JSON consumers do not round them to float64.
type eventLine struct {
	Seq             uint64   `json:"seq"`
	TS              float64  `json:"ts"`
	DPRank          *int     `json:"dp_rank,omitempty"`
	Type            string   `json:"type"`
	BlockHashes     []string `json:"block_hashes,omitempty"`
	ParentBlockHash *string  `json:"parent_block_hash,omitempty"`
	TokenIDs        []uint32 `json:"token_ids,omitempty"`
	BlockSize       *int     `json:"block_size,omitempty"`
	LoRAName        *string  `json:"lora_name,omitempty"`
	Medium          *string  `json:"medium,omitempty"`
	GroupIdx        *int     `json:"group_idx,omitempty"`
}

type eventsSummary struct {
	Summary struct {
		Batches      uint64 `json:"batches"`
		Events       uint64 `json:"events"`
		Gaps         uint64 `json:"gaps"`
		Replayed     uint64 `json:"replayed"`
		DecodeErrors uint64 `json:"decode_errors"`
	} `json:"summary"`
}

func runEvents(ctx context.Context, cmd *cli.Command) error {
	endpoint := cmd.String("endpoint")
	if endpoint == "" {
		return usageError("--endpoint is required, e.g. tcp://10.0.0.7:5557")
	}
	if err := checkZMQEndpoint("--endpoint", endpoint); err != nil {
		return err
	}
	replay := cmd.String("replay")
	if replay != "" {
		if err := checkZMQEndpoint("--replay", replay); err != nil {
			return err
		}
	}
	count, err := strconv.ParseUint(cmd.String("count"), 10, 63)
	if err != nil {
		return usageError("--count %q is not a non-negative integer", cmd.String("count"))
	}
	timeout, err := parseDurationFlag("--timeout", cmd.String("timeout"))
	if err != nil {
		return err
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	out := bufio.NewWriter(cmd.Root().Writer)
	enc := json.NewEncoder(out)
	var (
		mu      sync.Mutex
		printed uint64
	)
	sub, err := kvindex.NewSubscriber(kvindex.SubscriberConfig{
		Target:   target.ID{Endpoint: endpoint},
		Endpoint: endpoint,
		Replay:   replay,
		Topic:    cmd.String("topic"),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handle: func(seq uint64, b *events.Batch, _ bool) {
			mu.Lock()
			defer mu.Unlock()
			for i := range b.Events {
				if count > 0 && printed >= count {
					return
				}
				_ = enc.Encode(newEventLine(seq, b, &b.Events[i]))
				printed++
			}
			_ = out.Flush()
			if count > 0 && printed >= count {
				stop()
			}
		},
	})
	if err != nil {
		return usageError("%v", err)
	}
	if err := sub.Run(ctx); err != nil {
		return err
	}
	st := sub.Status()
	var sum eventsSummary
	sum.Summary.Batches = st.Batches
	sum.Summary.Events = printed
	sum.Summary.Gaps = st.Gaps
	sum.Summary.Replayed = st.Replayed
	sum.Summary.DecodeErrors = st.DecodeErrors
	mu.Lock()
	defer mu.Unlock()
	if err := enc.Encode(sum); err != nil {
		return err
	}
	return out.Flush()
}

func newEventLine(seq uint64, b *events.Batch, ev *events.Event) eventLine {
	l := eventLine{Seq: seq, TS: b.TS, Type: ev.Kind.String()}
	if b.HasDPRank {
		r := b.DPRank
		l.DPRank = &r
	}
	if ev.Kind == events.KindAllBlocksCleared {
		return l
	}
	l.BlockHashes = make([]string, len(ev.BlockHashes))
	for i, h := range ev.BlockHashes {
		l.BlockHashes[i] = strconv.FormatUint(h, 10)
	}
	if ev.HasParentHash {
		p := strconv.FormatUint(ev.ParentHash, 10)
		l.ParentBlockHash = &p
	}
	if ev.Kind == events.KindBlockStored {
		l.TokenIDs = ev.TokenIDs
		bs := ev.BlockSize
		l.BlockSize = &bs
		if ev.LoRAName != "" {
			name := ev.LoRAName
			l.LoRAName = &name
		}
	}
	if ev.Medium != "" {
		m := ev.Medium
		l.Medium = &m
	}
	if ev.HasGroupIdx {
		g := ev.GroupIdx
		l.GroupIdx = &g
	}
	return l
}

// checkZMQEndpoint rejects addresses libzmq would refuse, with a message
// that names the flag instead of a bare errno.
func checkZMQEndpoint(flag, v string) error {
	rest, ok := strings.CutPrefix(v, "tcp://")
	if !ok {
		if strings.HasPrefix(v, "ipc://") || strings.HasPrefix(v, "inproc://") {
			return nil
		}
		return usageError("%s %q: want tcp://HOST:PORT", flag, v)
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 {
		return usageError("%s %q: want tcp://HOST:PORT", flag, v)
	}
	if p, err := strconv.Atoi(rest[i+1:]); err != nil || p <= 0 || p > 65535 {
		return usageError("%s %q: bad port", flag, v)
	}
	return nil
}

func parseDurationFlag(flag, v string) (time.Duration, error) {
	if v == "0" || v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, usageError("%s %q is not a duration like 30s", flag, v)
	}
	return d, nil
}
