package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/health"
	"github.com/prefixrouter/prefixrouter/kvindex/events"
	"github.com/prefixrouter/prefixrouter/kvtransport"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// eventsSettings is what the events command's flags set.
type eventsSettings struct {
	Endpoint, Replay, Topic string
	Count                   uint64
	Timeout                 time.Duration
}

func eventsCommand() *cli.Command {
	var s eventsSettings
	t := newFlagTable("events")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "events",
		Usage: "subscribe to a pod's KV-cache events and print them as JSON lines",
		Description: "The wiring check to run before anything else: connects to a vLLM pod's KV-event\n" +
			"publisher (--kv-events-config endpoint), prints one JSON object per event, recovers\n" +
			"sequence gaps through the replay socket when --replay is given, and ends with a summary line.\n" +
			"--endpoint also takes the pod's URL as serve's --endpoint does: its events= and replay=\n" +
			"options (default tcp://HOST:5557, no replay) are the sockets of rank 0.",
		Flags: []cli.Flag{
			defaultText(b.str("endpoint", "the pod's event publisher, tcp://HOST:PORT, or the pod's URL as serve takes it", &s.Endpoint), "none, required"),
			b.str("replay", "the pod's replay socket, tcp://HOST:PORT", &s.Replay),
			defaultText(b.str("topic", "topic prefix to subscribe to", &s.Topic), "every topic"),
			defaultText(b.uint64("count", "exit after printing this many events", &s.Count), "0, no limit"),
			defaultText(bind(b, &cli.DurationFlag{Name: "timeout", Usage: "exit after this long", Destination: &s.Timeout}, notNegative),
				"0, no limit"),
		},
		Action: func(ctx context.Context, cmd *cli.Command) error { return runEvents(ctx, cmd.Root().Writer, &s) },
	})
}

// notNegative refuses a negative duration.
func notNegative(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("must not be negative, got %v", d)
	}
	return nil
}

// sockets are the publisher and replay addresses: --endpoint and --replay,
// or, when --endpoint is a pod's URL as serve takes it, rank 0's sockets
// from its events= and replay= options (--replay still wins).
func (s *eventsSettings) sockets() (events, replay string, err error) {
	if s.Endpoint == "" {
		return "", "", usageError("--endpoint is required, e.g. tcp://10.0.0.7:5557")
	}
	if !strings.HasPrefix(s.Endpoint, "http://") && !strings.HasPrefix(s.Endpoint, "https://") {
		return s.Endpoint, s.Replay, nil
	}
	spec, err := health.ParseSpec(s.Endpoint)
	if err != nil {
		return "", "", usageError("--endpoint %q: %v", s.Endpoint, err)
	}
	replay = s.Replay
	if replay == "" {
		replay = spec.Replay
	}
	return spec.Events, replay, nil
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

func runEvents(ctx context.Context, stdout io.Writer, s *eventsSettings) error {
	endpoint, replay, err := s.sockets()
	if err != nil {
		return err
	}
	count, timeout := s.Count, s.Timeout
	if err := checkZMQEndpoint("--endpoint", endpoint); err != nil {
		return err
	}
	if replay != "" {
		if err := checkZMQEndpoint("--replay", replay); err != nil {
			return err
		}
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()

	out := bufio.NewWriter(stdout)
	enc := json.NewEncoder(out)
	var (
		mu      sync.Mutex
		printed uint64
	)
	sub, err := kvtransport.NewSubscriber(kvtransport.SubscriberConfig{
		Target:   targetid.ID{Endpoint: endpoint},
		Endpoint: endpoint,
		Replay:   replay,
		Topic:    s.Topic,
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
