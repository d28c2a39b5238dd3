package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// accessLine is one request in the access log (--access-log): what the
// client asked, where it went and how it ended. It never carries prompt
// text or token ids. Numbers the router does not know are null: the prompt
// tokens when it only estimated them and the pod reported none, the
// predicted cached tokens on a forwarded endpoint, the times of a request
// that never reached a pod.
type accessLine struct {
	// Time is the request's arrival.
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	Method    string    `json:"method"`
	Path      string    `json:"path"`
	Model     string    `json:"model"`
	Stream    bool      `json:"stream"`
	// Tenant names the API key the client presented (--api-key-file),
	// never the key itself.
	Tenant string `json:"tenant,omitempty"`
	// Policy decided the target: --policy for the routed endpoints,
	// least-load for the forwarded ones; empty when none was decided.
	Policy string `json:"policy"`
	// Target is the last target tried (endpoint#rank); PrefillTarget,
	// for a request split between a prefill pod and a decode pod, the
	// prefill pod that computed its prompt.
	Target        string `json:"target"`
	PrefillTarget string `json:"prefill_target,omitempty"`
	// Status is what the client got; 499 when it left before any.
	Status int `json:"status"`
	// Outcome is prefixrouter_requests_total's outcome, or, for a request
	// the router answered itself, prefixrouter_requests_rejected_total's
	// reason.
	Outcome string `json:"outcome"`
	// PromptTokens counts the prompt as the router tokenized it, or as the
	// pod's usage reports it; PromptSource says which (ids, local, remote,
	// usage).
	PromptTokens          *int64 `json:"prompt_tokens"`
	PromptSource          string `json:"prompt_source"`
	PredictedCachedTokens *int64 `json:"predicted_cached_tokens"`
	ReportedCachedTokens  *int64 `json:"reported_cached_tokens"`
	// RouteMS is arrival to the first dispatch, TTFBMS arrival to the
	// first byte relayed, DurationMS arrival to the end of the response;
	// Retries counts the targets tried after the first.
	RouteMS    *float64 `json:"route_ms"`
	TTFBMS     *float64 `json:"ttfb_ms"`
	DurationMS float64  `json:"duration_ms"`
	Retries    int      `json:"retries"`
}

// statusClientGone is the status logged for a client that left before it
// got one (nginx's "client closed request").
const statusClientGone = 499

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

func millisOf(d time.Duration) *float64 {
	ms := millis(d)
	return &ms
}

// accessLogBuffer is how many lines may wait for the writer; past it lines
// are dropped and counted, never waited for.
const accessLogBuffer = 4096

// accessLog writes the access log's lines on its own goroutine, so that a
// slow disk or a blocked pipe never holds a request: write only queues a
// line, and a full queue drops it.
type accessLog struct {
	lines chan *accessLine
	dst   io.Writer
	out   *bufio.Writer
	file  *os.File // nil for standard output
	log   *slog.Logger

	droppedFull  prometheus.Counter
	droppedWrite prometheus.Counter
	lastErrLog   time.Time

	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
}

// openAccessLog opens dest ("-": standard output; else a file, appended
// to) and starts the writer.
func openAccessLog(dest string, reg prometheus.Registerer, log *slog.Logger) (*accessLog, error) {
	if dest == "-" {
		return newAccessLog(os.Stdout, nil, reg, log)
	}
	f, err := os.OpenFile(dest, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--access-log: %w", err)
	}
	l, err := newAccessLog(f, f, reg, log)
	if err != nil {
		f.Close()
	}
	return l, err
}

// newAccessLog starts a writer of lines to dst; file, when not nil, is
// closed with it.
func newAccessLog(dst io.Writer, file *os.File, reg prometheus.Registerer, log *slog.Logger) (*accessLog, error) {
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "prefixrouter_access_log_dropped_total",
		Help: "Access log lines lost: buffer_full (the writer fell behind; requests never wait for it) or write_error.",
	}, []string{"reason"})
	if err := reg.Register(dropped); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	l := &accessLog{lines: make(chan *accessLine, accessLogBuffer), dst: dst, file: file, log: log,
		out:         bufio.NewWriterSize(dst, 64<<10),
		droppedFull: dropped.WithLabelValues("buffer_full"), droppedWrite: dropped.WithLabelValues("write_error"),
		stop: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l, nil
}

// write queues line without waiting.
func (l *accessLog) write(line *accessLine) {
	if l.closed.Load() {
		return
	}
	select {
	case l.lines <- line:
	default:
		l.droppedFull.Inc()
	}
}

// run encodes the queued lines, and flushes whenever the queue is empty:
// lines reach the destination at once when the router is quiet, in
// batches when it is busy.
func (l *accessLog) run() {
	defer close(l.done)
	enc := json.NewEncoder(l.out)
	enc.SetEscapeHTML(false)
	pending := 0
	for {
		select {
		case line := <-l.lines:
			l.encode(enc, line, &pending)
			if len(l.lines) == 0 {
				l.flush(&pending)
			}
		case <-l.stop:
			for {
				select {
				case line := <-l.lines:
					l.encode(enc, line, &pending)
				default:
					l.flush(&pending)
					return
				}
			}
		}
	}
}

func (l *accessLog) encode(enc *json.Encoder, line *accessLine, pending *int) {
	if err := enc.Encode(line); err != nil {
		l.failed(err, pending)
		return
	}
	*pending++
}

func (l *accessLog) flush(pending *int) {
	if err := l.out.Flush(); err != nil {
		l.failed(err, pending)
		return
	}
	*pending = 0
}

// failed counts the lines a write error lost and starts a new buffer (a
// bufio.Writer keeps its first error), logging the error at most once a
// minute.
func (l *accessLog) failed(err error, pending *int) {
	l.droppedWrite.Add(float64(*pending))
	*pending = 0
	l.out.Reset(l.dst)
	if now := time.Now(); now.Sub(l.lastErrLog) >= time.Minute {
		l.lastErrLog = now
		l.log.Error("access log write failed; lines are counted in prefixrouter_access_log_dropped_total", "err", err)
	}
}

// close writes what is queued and closes the file. Lines written after
// it are dropped.
func (l *accessLog) close() {
	if l.closed.Swap(true) {
		return
	}
	close(l.stop)
	<-l.done
	l.closeFile()
}

func (l *accessLog) closeFile() {
	if l.file != nil {
		if err := l.file.Close(); err != nil {
			l.log.Error("closing the access log", "err", err)
		}
	}
}

// logAnswered writes the access line of a request the router answered
// itself (an error, /v1/models), once its answer is written.
func (r *Router) logAnswered(x *exchange, outcome string) {
	if r.alog == nil {
		return
	}
	line := x.accessLine(time.Since(x.start))
	line.Method, line.Status, line.Outcome = string(x.in.Method()), x.in.Response.StatusCode(), outcome
	if outcome == "canceled" {
		line.Status = statusClientGone
	}
	r.alog.write(line)
}

// accessLine is the line of x as known at its end, took after its arrival.
func (x *exchange) accessLine(took time.Duration) *accessLine {
	line := &accessLine{Time: x.start, RequestID: x.id, Method: x.ep.method(), Path: x.path, Model: x.model,
		Stream: x.stream, Tenant: x.tenant, DurationMS: millis(took)}
	if x.dec != nil {
		line.Policy = x.dec.PolicyName()
	}
	return line
}

// attemptLine is the access line of a request that reached a pod, by how
// its last attempt ended; its prompt is filled in by promptOutcome.
func (a *attempt) attemptLine(took time.Duration) *accessLine {
	line := a.x.accessLine(took)
	line.Target, line.Outcome, line.Retries = a.name, a.label, a.n
	if p := a.promptAttempt(); p != a {
		line.PrefillTarget = p.name
	}
	line.RouteMS = millisOf(a.x.routeTime)
	if line.Status = a.sent; line.Status == 0 {
		line.Status = statusClientGone
	}
	if a.answered {
		line.TTFBMS = millisOf(a.ttft)
	}
	return line
}
