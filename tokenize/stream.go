package tokenize

import (
	"context"
	"errors"
	"time"
)

// Stream is a prompt's ids encoded a segment at a time (see bpe.Stream).
// The router steps it only until no pod can match further, routes, and
// finishes the rest while the pod works; Finish also records the model's
// metrics and, in auto mode, the sampled comparison with the pod. Encoders
// without segments (the bytes model, the cgo backend) encode everything in
// the first step.
type Stream struct {
	// Prompt is the text being encoded (the rendered chat for chat).
	Prompt string
	ids    idStream
	model  *Model
	spent  time.Duration // time inside Step, for the model's histogram
	// observed says the encode is in the model's metrics already.
	observed bool
	compare  func(ids []uint32)
}

// idStream is the encoder side of a Stream.
type idStream interface {
	Step() error
	Done() bool
	IDs() []uint32
	Consumed() int
}

// segmentStreamer is an encoder that can produce ids a segment at a time.
type segmentStreamer interface {
	stream(text string, addSpecial bool) idStream
}

func (e bpeEncoder) stream(text string, addSpecial bool) idStream {
	return e.t.NewStream(text, addSpecial)
}

// wholeStream encodes everything in its first step.
type wholeStream struct {
	enc        encoder
	text       string
	addSpecial bool
	ids        []uint32
	done       bool
}

func (w *wholeStream) Step() error {
	if w.done {
		return nil
	}
	ids, err := w.enc.encode(w.text, w.addSpecial)
	if err != nil {
		return err
	}
	w.ids, w.done = ids, true
	return nil
}

func (w *wholeStream) Done() bool    { return w.done }
func (w *wholeStream) IDs() []uint32 { return w.ids }
func (w *wholeStream) Consumed() int {
	if w.done {
		return len(w.text)
	}
	return 0
}

// ErrNotLocal means the model's requests of this kind are tokenized by the
// pod (remote mode, or a template that only renders there): use
// TokenizeChat / TokenizePrompt.
var ErrNotLocal = errors.New("model is not tokenized locally")

// StreamChat renders a chat request locally and returns its ids as a
// Stream. baseURL is the pod auto mode compares a sample with.
func (m *Model) StreamChat(req ChatRequest, baseURL string) (*Stream, error) {
	mode := m.chatMode()
	if mode == ModeRemote && m.reg != nil {
		return nil, ErrNotLocal
	}
	start := time.Now()
	prompt, err := m.RenderChat(req)
	if err != nil {
		return nil, err
	}
	st, err := m.newStream(prompt, false, time.Since(start))
	if err != nil {
		return nil, err
	}
	if mode == ModeAuto && m.reg.sample() {
		req := req.detached() // Finish may run after the caller's request is gone
		st.compare = func(ids []uint32) {
			m.reg.compareInBackground(m, baseURL, func(ctx context.Context) (Result, error) {
				return m.reg.remoteChat(ctx, m.name, req, baseURL)
			}, prompt, ids)
		}
	}
	return st, nil
}

// StreamPrompt returns the ids of a completion prompt as a Stream (see
// StreamChat).
func (m *Model) StreamPrompt(prompt string, addSpecialTokens bool, baseURL string) (*Stream, error) {
	mode := m.promptMode()
	if mode == ModeRemote && m.reg != nil {
		return nil, ErrNotLocal
	}
	st, err := m.newStream(prompt, addSpecialTokens, 0)
	if err != nil {
		return nil, err
	}
	if mode == ModeAuto && m.reg.sample() {
		st.compare = func(ids []uint32) {
			m.reg.compareInBackground(m, baseURL, func(ctx context.Context) (Result, error) {
				return m.reg.remotePrompt(ctx, m.name, prompt, addSpecialTokens, baseURL)
			}, "", ids)
		}
	}
	return st, nil
}

func (m *Model) newStream(text string, addSpecial bool, spent time.Duration) (*Stream, error) {
	if m.enc == nil {
		return nil, ErrNotLocal
	}
	st := &Stream{Prompt: text, model: m, spent: spent}
	if s, ok := m.enc.(segmentStreamer); ok {
		st.ids = s.stream(text, addSpecial)
	} else {
		st.ids = &wholeStream{enc: m.enc, text: text, addSpecial: addSpecial}
	}
	return st, nil
}

// Step encodes the next segment.
func (s *Stream) Step() error {
	start := time.Now()
	err := s.ids.Step()
	s.spent += time.Since(start)
	if err != nil {
		s.observe(err)
	}
	return err
}

// Prefetch starts encoding the later half of the prompt on another
// goroutine (see bpe.Stream.Prefetch), for a caller that expects to read it
// all; a prompt too short to gain from it, or an encoder without segments,
// is left alone.
func (s *Stream) Prefetch() {
	const minBytes, minSegments = 4096, 4
	if p, ok := s.ids.(interface{ Prefetch(int) }); ok && len(s.Prompt)-s.ids.Consumed() >= minBytes {
		p.Prefetch(minSegments)
	}
}

// StopPrefetch asks the work Prefetch started to stop at its next segment:
// the caller has read as far as it needs before the request leaves, and
// the core is better spent on requests. Later Steps encode the rest.
func (s *Stream) StopPrefetch() {
	if p, ok := s.ids.(interface{ StopPrefetch() }); ok {
		p.StopPrefetch()
	}
}

// Done reports whether the whole prompt is encoded.
func (s *Stream) Done() bool { return s.ids.Done() }

// IDs returns the ids so far, valid until the next Step.
func (s *Stream) IDs() []uint32 { return s.ids.IDs() }

// EstimateCount is the prompt's token count: exact once Done, else the ids
// so far plus the rest of the text at the bytes per token seen so far, or,
// before a sample worth the name, at the model's recent rate.
func (s *Stream) EstimateCount() int {
	ids, done := len(s.ids.IDs()), s.ids.Done()
	if done {
		return ids
	}
	used, rest := s.ids.Consumed(), len(s.Prompt)-s.ids.Consumed()
	rate := s.model.bytesPerToken()
	if used >= minRateSample && ids > 0 {
		rate = float64(used) / float64(ids)
	}
	return ids + int(float64(rest)/rate)
}

// minRateSample is the prefix length from which a stream's own bytes per
// token beats the model's average (a first step may be one special token).
const minRateSample = 512

// Finish encodes the rest of the prompt and returns all its ids.
func (s *Stream) Finish() ([]uint32, error) {
	start := time.Now()
	for !s.ids.Done() {
		if err := s.ids.Step(); err != nil {
			s.spent += time.Since(start)
			s.observe(err)
			return nil, err
		}
	}
	s.spent += time.Since(start)
	s.observe(nil)
	ids := s.ids.IDs()
	s.model.observeRate(len(s.Prompt), len(ids))
	if s.compare != nil {
		s.compare(ids)
		s.compare = nil
	}
	return ids, nil
}

// observe records the stream once, as TokenizeChat records a call.
func (s *Stream) observe(err error) {
	if s.observed || s.model.reg == nil {
		return
	}
	s.observed = true
	met, name := s.model.reg.metrics, s.model.name
	met.requests.WithLabelValues(name, ModeLocal.String()).Inc()
	met.seconds.WithLabelValues(name, ModeLocal.String()).Observe(s.spent.Seconds())
	if err != nil {
		met.errors.WithLabelValues(name, ModeLocal.String()).Inc()
	}
}
