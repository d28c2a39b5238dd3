package peers

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/prefixrouter/prefixrouter/kvindex"
	"github.com/prefixrouter/prefixrouter/targetid"
)

// The wire format: every message is one ZeroMQ frame holding one msgpack
// array, the envelope
//
//	[version, origin, sent, seq, kind, body]
//
// version is WireVersion (1); origin the sender's replica id (a string);
// sent its wall clock at sending, in Unix nanoseconds; seq the sender's
// message count from 1 per process (a gap is lost messages, a smaller one
// a restart); kind 1 to 5; body by kind:
//
//	prediction     (1): [placement, endpoint, rank, deadline, model, lora, block_size, [key, ...]]
//	withdrawal     (2): [placement]
//	flights        (3): [[endpoint, rank, in_flight, prefilling, queued_uncached_tokens], ...]
//	bye            (4): []
//	flights update (5): as flights
//
// flights lists every target the sender has work on and replaces what a
// receiver held of it; a flights update lists the targets whose work
// changed (zeros included) and leaves the others.
//
// placement is the sender's number for the request's predictions (what a
// withdrawal names); endpoint and rank are the target id as every replica
// names it (endpoint#rank); deadline is in Unix nanoseconds; keys are the
// block keys (uint64). The request's id, prompt and cache_salt never leave
// the replica (the keys fold the salt in).
//
// Compatibility: a receiver ignores array items beyond those it knows, so
// a field added at the end of an array keeps the version; anything else
// bumps it, and a receiver refuses a version it does not know (counted,
// and shown on the peer). Integers may come in any msgpack integer form.

// WireVersion is the version this build writes and reads.
const WireVersion = 1

// Kind is what a message carries.
type Kind uint8

// Kinds.
const (
	// KindPrediction: the sender recorded predicted placements.
	KindPrediction Kind = 1
	// KindWithdrawal: the pod rejected the request before computing
	// anything; the placement's predictions end at once.
	KindWithdrawal Kind = 2
	// KindFlights: the sender's in-flight work per target, sent every
	// flights interval; it is also the heartbeat.
	KindFlights Kind = 3
	// KindBye: the sender is shutting down; its in-flight work ends now
	// (its predictions still expire on their own deadlines).
	KindBye Kind = 4
	// KindFlightsUpdate: the sender's in-flight work on the listed
	// targets changed (a zero entry: none left); the others stand.
	KindFlightsUpdate Kind = 5
)

// numKinds bounds the kinds, for arrays indexed by kind.
const numKinds = 6

// kinds lists the kinds in order.
var kinds = []Kind{KindPrediction, KindWithdrawal, KindFlights, KindBye, KindFlightsUpdate}

var kindNames = map[Kind]string{KindPrediction: "prediction", KindWithdrawal: "withdrawal", KindFlights: "flights",
	KindBye: "bye", KindFlightsUpdate: "flights_update"}

func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Limits a decoded message must respect.
const (
	maxOrigin  = 253 // a DNS name's length: pod names fit
	maxString  = 4096
	maxKeys    = 1 << 17 // 2M tokens at block size 16
	maxFlights = 1 << 14
	maxRank    = 1 << 16
	maxNesting = 8 // in skipped trailing items
)

// Message is one message between replicas.
type Message struct {
	Version int
	Origin  string
	Sent    time.Time
	Seq     uint64
	Kind    Kind
	// By kind.
	Prediction Prediction
	Withdrawal uint64 // the placement withdrawn
	Flights    []TargetFlights
}

// Prediction is one request's predicted placements on one target.
type Prediction struct {
	Placement uint64
	Target    targetid.ID
	Deadline  time.Time
	Model     string
	LoRA      string
	BlockSize int
	Keys      []kvindex.Key
}

// TargetFlights is the sender's in-flight work on one target.
type TargetFlights struct {
	Target               targetid.ID
	InFlight             int64
	Prefilling           int64
	QueuedUncachedTokens int64
}

// ErrVersion is wrapped by Decode's error for a version it does not read.
var ErrVersion = errors.New("unsupported wire version")

// Encode appends m's wire form to dst (m.Version is ignored: it writes
// WireVersion).
func Encode(dst []byte, m *Message) ([]byte, error) {
	buf := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(buf)
	must := func(errs ...error) error { return errors.Join(errs...) }
	err := must(e.EncodeArrayLen(6), e.EncodeInt(WireVersion), e.EncodeString(m.Origin),
		e.EncodeInt(m.Sent.UnixNano()), e.EncodeUint(m.Seq), e.EncodeUint(uint64(m.Kind)))
	if err != nil {
		return nil, fmt.Errorf("encode peer message: %w", err)
	}
	switch m.Kind {
	case KindPrediction:
		p := &m.Prediction
		err = must(e.EncodeArrayLen(8), e.EncodeUint(p.Placement), e.EncodeString(p.Target.Endpoint),
			e.EncodeInt(int64(p.Target.Rank)), e.EncodeInt(p.Deadline.UnixNano()), e.EncodeString(p.Model),
			e.EncodeString(p.LoRA), e.EncodeInt(int64(p.BlockSize)), e.EncodeArrayLen(len(p.Keys)))
		for _, k := range p.Keys {
			if err != nil {
				break
			}
			err = e.EncodeUint(uint64(k))
		}
	case KindWithdrawal:
		err = must(e.EncodeArrayLen(1), e.EncodeUint(m.Withdrawal))
	case KindFlights, KindFlightsUpdate:
		err = e.EncodeArrayLen(len(m.Flights))
		for _, f := range m.Flights {
			if err != nil {
				break
			}
			err = must(e.EncodeArrayLen(5), e.EncodeString(f.Target.Endpoint), e.EncodeInt(int64(f.Target.Rank)),
				e.EncodeInt(f.InFlight), e.EncodeInt(f.Prefilling), e.EncodeInt(f.QueuedUncachedTokens))
		}
	case KindBye:
		err = e.EncodeArrayLen(0)
	default:
		return nil, fmt.Errorf("encode peer message: unknown kind %d", m.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("encode peer message: %w", err)
	}
	return buf.Bytes(), nil
}

var decoderPool = sync.Pool{New: func() any { return msgpack.NewDecoder(nil) }}

// Decode parses one message. Any structural problem, a value out of its
// range or an unknown kind is an error (the receiver counts it and skips
// the message); a version other than WireVersion wraps ErrVersion.
func Decode(b []byte) (Message, error) {
	r := bytes.NewReader(b)
	md := decoderPool.Get().(*msgpack.Decoder)
	md.Reset(r)
	defer decoderPool.Put(md)
	d := &decoder{d: md, r: r}
	var m Message
	n, err := d.array(6, "envelope")
	if err != nil {
		return m, err
	}
	v, err := d.int("version", 0, math.MaxInt32)
	if err != nil {
		return m, err
	}
	m.Version = int(v)
	if m.Version != WireVersion {
		return m, fmt.Errorf("%w %d (this router reads %d)", ErrVersion, m.Version, WireVersion)
	}
	if m.Origin, err = d.str("origin", maxOrigin); err != nil {
		return m, err
	}
	if m.Origin == "" {
		return m, errors.New("empty origin")
	}
	sent, err := d.int("sent", math.MinInt64, math.MaxInt64)
	if err != nil {
		return m, err
	}
	m.Sent = time.Unix(0, sent)
	if m.Seq, err = d.uint("seq"); err != nil {
		return m, err
	}
	k, err := d.int("kind", 0, math.MaxUint8)
	if err != nil {
		return m, err
	}
	m.Kind = Kind(k)
	switch m.Kind {
	case KindPrediction:
		err = d.prediction(&m.Prediction)
	case KindWithdrawal:
		var bn int
		if bn, err = d.array(1, "withdrawal"); err == nil {
			if m.Withdrawal, err = d.uint("placement"); err == nil {
				err = d.skipRest(bn, 1)
			}
		}
	case KindFlights, KindFlightsUpdate:
		m.Flights, err = d.flights()
	case KindBye:
		var bn int
		if bn, err = d.array(0, "bye"); err == nil {
			err = d.skipRest(bn, 0)
		}
	default:
		return m, fmt.Errorf("unknown kind %d", k)
	}
	if err != nil {
		return m, fmt.Errorf("%s: %w", m.Kind, err)
	}
	if err := d.skipRest(n, 6); err != nil {
		return m, err
	}
	if r.Len() != 0 {
		return m, fmt.Errorf("%d bytes after the message", r.Len())
	}
	return m, nil
}

// decoder reads the subset of msgpack the format uses, bounding what a
// hostile message can make it allocate or recurse into.
type decoder struct {
	d *msgpack.Decoder
	r *bytes.Reader
}

// array reads an array header of at least min items.
func (d *decoder) array(min int, what string) (int, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n < min {
		return 0, fmt.Errorf("%s: %d items, want at least %d", what, n, min)
	}
	if n > d.r.Len() {
		// Every item takes at least a byte.
		return 0, fmt.Errorf("%s: %d items declared, %d bytes left", what, n, d.r.Len())
	}
	return n, nil
}

func (d *decoder) int(what string, lo, hi int64) (int64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	var v int64
	switch {
	case c == msgpcode.Uint64:
		u, err := d.d.DecodeUint64()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("%s: %d out of range", what, u)
		}
		v = int64(u)
	case isInt(c):
		if v, err = d.d.DecodeInt64(); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
	default:
		return 0, fmt.Errorf("%s: want an integer, got msgpack code %#x", what, c)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%s: %d out of range [%d, %d]", what, v, lo, hi)
	}
	return v, nil
}

func (d *decoder) uint(what string) (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if !isInt(c) {
		return 0, fmt.Errorf("%s: want an unsigned integer, got msgpack code %#x", what, c)
	}
	if c >= msgpcode.Int8 && c <= msgpcode.Int64 || msgpcode.IsFixedNum(c) && c > msgpcode.PosFixedNumHigh {
		// A signed form: fine while not negative.
		v, err := d.d.DecodeInt64()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if v < 0 {
			return 0, fmt.Errorf("%s: %d is negative", what, v)
		}
		return uint64(v), nil
	}
	v, err := d.d.DecodeUint64()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Uint64 || c >= msgpcode.Int8 && c <= msgpcode.Int64
}

func (d *decoder) str(what string, limit int) (string, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%s: want a string, got msgpack code %#x", what, c)
	}
	// The library grows its buffer as bytes arrive, so a hostile length
	// costs at most the message's own size before it fails.
	s, err := d.d.DecodeString()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if len(s) > limit {
		return "", fmt.Errorf("%s: %d bytes, at most %d", what, len(s), limit)
	}
	return s, nil
}

func (d *decoder) target(id *targetid.ID) error {
	var err error
	if id.Endpoint, err = d.str("endpoint", maxString); err != nil {
		return err
	}
	if id.Endpoint == "" {
		return errors.New("empty endpoint")
	}
	rank, err := d.int("rank", 0, maxRank)
	id.Rank = int(rank)
	return err
}

func (d *decoder) prediction(p *Prediction) error {
	n, err := d.array(8, "prediction")
	if err != nil {
		return err
	}
	if p.Placement, err = d.uint("placement"); err != nil {
		return err
	}
	if err := d.target(&p.Target); err != nil {
		return err
	}
	dl, err := d.int("deadline", math.MinInt64, math.MaxInt64)
	if err != nil {
		return err
	}
	p.Deadline = time.Unix(0, dl)
	if p.Model, err = d.str("model", maxString); err != nil {
		return err
	}
	if p.LoRA, err = d.str("lora", maxString); err != nil {
		return err
	}
	bs, err := d.int("block_size", 1, math.MaxInt32)
	if err != nil {
		return err
	}
	p.BlockSize = int(bs)
	nk, err := d.array(0, "keys")
	if err != nil {
		return err
	}
	if nk > maxKeys {
		return fmt.Errorf("keys: %d, at most %d", nk, maxKeys)
	}
	p.Keys = make([]kvindex.Key, nk)
	for i := range p.Keys {
		k, err := d.uint("key")
		if err != nil {
			return err
		}
		p.Keys[i] = kvindex.Key(k)
	}
	return d.skipRest(n, 8)
}

func (d *decoder) flights() ([]TargetFlights, error) {
	n, err := d.array(0, "flights")
	if err != nil {
		return nil, err
	}
	if n > maxFlights {
		return nil, fmt.Errorf("flights: %d targets, at most %d", n, maxFlights)
	}
	out := make([]TargetFlights, n)
	for i := range out {
		f := &out[i]
		fn, err := d.array(5, "target flights")
		if err != nil {
			return nil, err
		}
		if err := d.target(&f.Target); err != nil {
			return nil, err
		}
		for _, v := range []struct {
			what string
			dst  *int64
		}{{"in_flight", &f.InFlight}, {"prefilling", &f.Prefilling}, {"queued_uncached_tokens", &f.QueuedUncachedTokens}} {
			if *v.dst, err = d.int(v.what, 0, math.MaxInt64); err != nil {
				return nil, err
			}
		}
		if err := d.skipRest(fn, 5); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// skipRest skips an array's items beyond the known ones: fields a later
// version appended.
func (d *decoder) skipRest(n, known int) error {
	for range n - known {
		if err := d.skip(0); err != nil {
			return fmt.Errorf("trailing item: %w", err)
		}
	}
	return nil
}

// skip skips one value, recursing into arrays and maps no deeper than
// maxNesting.
func (d *decoder) skip(depth int) error {
	if depth > maxNesting {
		return errors.New("nested too deep")
	}
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.d.DecodeArrayLen()
		if err != nil {
			return err
		}
		return d.skipN(n, depth)
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.d.DecodeMapLen()
		if err != nil {
			return err
		}
		if n > d.r.Len() {
			return fmt.Errorf("map of %d entries declared, %d bytes left", n, d.r.Len())
		}
		return d.skipN(2*n, depth)
	}
	return d.d.Skip()
}

func (d *decoder) skipN(n, depth int) error {
	if n > d.r.Len() {
		return fmt.Errorf("%d items declared, %d bytes left", n, d.r.Len())
	}
	for range n {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
