package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
)

// Options configure a Registry. The zero value works: no metrics exported,
// slog.Default logging, a 10 s HTTP client.
type Options struct {
	// Registerer receives the package's metrics; nil keeps them private.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// HTTPClient calls the pods' render endpoints.
	HTTPClient *http.Client
	// SampleRate is the fraction of auto-mode requests compared against the
	// pod in the background (default 0.05; 1 compares every request).
	SampleRate float64
	// MaxComparisons bounds concurrent background comparisons (default 4);
	// a sample that finds no free slot is skipped, never queued.
	MaxComparisons int
	// CacheMaxBytes is the segment cache budget shared by all models
	// (default 256 MiB; negative disables the cache).
	CacheMaxBytes int64
	// Hub fetches the files of specs that name a hub repository (see
	// ParseSpec); nil refuses them.
	Hub *hub.Client
	// MessageCacheMaxBytes is the budget of the decoded chat message cache
	// shared by all models (default 64 MiB; negative disables it). It
	// saves re-decoding the earlier turns of a conversation; renders are
	// the same with or without it.
	MessageCacheMaxBytes int64
}

// Registry holds the served models by name.
type Registry struct {
	opts    Options
	log     *slog.Logger
	client  *http.Client
	metrics *metrics
	cache   *segmentCache
	values  *valueCache
	compare chan struct{}

	mu     sync.RWMutex
	models map[string]*Model
	nextID uint64

	// authz is the Authorization header of every render call
	// (SetAuthorization); nil: none.
	authz atomic.Pointer[func() string]
}

// SetAuthorization makes every remote render or tokenize call carry the
// Authorization header fn returns, read at each call so that a rotated
// credential applies at once ("": none). The router sets it to its
// upstream credential (--upstream-api-key-file).
func (r *Registry) SetAuthorization(fn func() string) { r.authz.Store(&fn) }

func (r *Registry) authorization() string {
	if fn := r.authz.Load(); fn != nil && *fn != nil {
		return (*fn)()
	}
	return ""
}

// NewRegistry builds an empty registry.
func NewRegistry(opts Options) *Registry {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.SampleRate <= 0 {
		opts.SampleRate = 0.05
	}
	if opts.MaxComparisons <= 0 {
		opts.MaxComparisons = 4
	}
	if opts.CacheMaxBytes == 0 {
		opts.CacheMaxBytes = 256 << 20
	}
	if opts.MessageCacheMaxBytes == 0 {
		opts.MessageCacheMaxBytes = 64 << 20
	}
	r := &Registry{
		opts:    opts,
		log:     opts.Logger.With("component", "tokenize"),
		client:  opts.HTTPClient,
		metrics: newMetrics(opts.Registerer),
		compare: make(chan struct{}, opts.MaxComparisons),
		models:  map[string]*Model{},
	}
	if opts.CacheMaxBytes > 0 {
		r.cache = newSegmentCache(opts.CacheMaxBytes, r.metrics)
	}
	if opts.MessageCacheMaxBytes > 0 {
		r.values = newValueCache(opts.MessageCacheMaxBytes, r.metrics)
	}
	return r
}

// AddSpec adds a model from a --tokenizer flag value (see ParseSpec); a
// value that names no mode is local.
func (r *Registry) AddSpec(text string) (*Model, error) {
	s, err := ParseSpec(text)
	if err == nil {
		var m *Model
		if m, err = r.Load(context.Background(), s); err == nil {
			return m, nil
		}
	}
	return nil, fmt.Errorf("tokenizer spec %q: %w", text, err)
}

// Load adds the model a parsed spec describes. A hub repository's files are
// fetched first (Options.Hub) unless the mode is remote, which never reads
// them. When that fails in mode auto the model is served remote, with a
// warning naming the reason; in mode local the failure is the error.
func (r *Registry) Load(ctx context.Context, s Spec) (*Model, error) {
	switch {
	case s.Hub == nil && s.Path == "" && s.Mode != ModeRemote:
		return nil, fmt.Errorf("no tokenizer files for mode %s: give MODEL=PATH or MODEL=hf:ORG/NAME, or MODEL:remote= for the pods to tokenize", s.Mode)
	case s.Hub == nil:
		return r.Add(s.Name, s.Path, s.Mode)
	case s.Mode == ModeRemote:
		return r.Add(s.Name, "", ModeRemote)
	}
	m, err := r.addFromHub(ctx, s)
	if err == nil || s.Mode == ModeLocal || ctx.Err() != nil {
		return m, err
	}
	m, rerr := r.Add(s.Name, "", ModeRemote)
	if rerr != nil {
		return nil, rerr
	}
	r.metrics.switches.WithLabelValues(s.Name, "hub_unavailable").Inc()
	r.log.Warn("tokenizer files unavailable; the pods' render endpoints tokenize this model",
		"model", s.Name, "source", hubPrefix+s.Hub.String(), "reason", err)
	return m, nil
}

func (r *Registry) addFromHub(ctx context.Context, s Spec) (*Model, error) {
	if r.opts.Hub == nil {
		return nil, fmt.Errorf("%s: this registry has no hub client", s.Hub)
	}
	dir, err := fetchTokenizer(ctx, r.opts.Hub, s.Name, *s.Hub, r.log)
	if err != nil {
		return nil, err
	}
	m, err := r.Add(s.Name, dir, s.Mode)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Hub, err)
	}
	r.log.Info("tokenizer files from the hub cache", "model", s.Name, "repo", s.Hub.Repo, "revision", s.Hub.Revision, "dir", dir)
	return m, nil
}

// Add loads a model and registers it under name, replacing any model of
// that name. path is a model directory, a tokenizer.json file, "bytes", or
// empty for remote-only. A model whose chat template fails to compile is
// still added: chat requests go remote (logged and counted); with mode
// local they fail.
func (r *Registry) Add(name, path string, mode Mode) (*Model, error) {
	m := &Model{name: name, reg: r, configured: mode}
	switch path {
	case "":
		if mode != ModeRemote {
			return nil, fmt.Errorf("model %s: no tokenizer path; only mode remote works without one", name)
		}
	case "bytes":
		m.enc, m.chat = bytesEncoder{}, bytesChat{}
	default:
		r.mu.Lock()
		r.nextID++
		id := r.nextID
		r.mu.Unlock()
		if err := loadLocal(m, path, r.cache.forModel(id)); err != nil {
			return nil, fmt.Errorf("model %s: %w", name, err)
		}
		if j, ok := m.chat.(*jinjaChat); ok {
			j.values = r.values
		}
	}
	m.mode.Store(int32(mode))
	r.metrics.setMode(name, mode)
	if m.chatErr != nil && !errors.Is(m.chatErr, errNoTemplateFile) && mode != ModeRemote {
		r.metrics.switches.WithLabelValues(name, "template_compile").Inc()
		r.log.Warn("chat template does not compile locally; chat requests for this model use the pod's render endpoint",
			"model", name, "err", m.chatErr)
	}
	r.mu.Lock()
	r.models[name] = m
	r.mu.Unlock()
	return m, nil
}

// Model returns the named model or an error wrapping ErrUnknownModel.
func (r *Registry) Model(name string) (*Model, error) {
	r.mu.RLock()
	m, ok := r.models[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownModel, name)
	}
	return m, nil
}

// Names lists the registered model names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.models))
	for n := range r.models {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Close releases the segment and message caches.
func (r *Registry) Close() {
	if r.cache != nil {
		r.cache.close()
	}
	r.values.close()
}

// NeedsBaseURL reports whether a TokenizeChat (chat=true) or
// TokenizePrompt call may contact the pod, so the caller must pass a base
// URL: the model is remote or auto, or (chat) its template only renders
// remotely. In auto mode the URL is used for the sampled comparisons.
func (m *Model) NeedsBaseURL(chat bool) bool {
	if m.reg == nil {
		return false
	}
	if chat {
		return m.chatMode() != ModeLocal
	}
	return m.promptMode() != ModeLocal
}

// EffectiveMode is the mode a TokenizeChat (chat=true) or TokenizePrompt
// call really runs in: a model whose template or encoder cannot run locally
// is served remote whatever it was configured as.
func (m *Model) EffectiveMode(chat bool) Mode {
	if chat {
		return m.chatMode()
	}
	return m.promptMode()
}

// chatMode is the effective mode for chat requests: a model whose template
// cannot render locally is served remote.
func (m *Model) chatMode() Mode {
	if m.chat == nil {
		return ModeRemote
	}
	return m.Mode()
}

func (m *Model) promptMode() Mode {
	if m.enc == nil {
		return ModeRemote
	}
	return m.Mode()
}

// TokenizeChat returns the prompt ids for a chat request according to the
// model's mode. baseURL is the pod to ask in remote mode (and for auto
// comparisons); it may be empty in local mode.
func (m *Model) TokenizeChat(ctx context.Context, req ChatRequest, baseURL string) (Result, error) {
	mode := m.chatMode()
	if m.reg == nil {
		mode = ModeLocal
	}
	start := time.Now()
	res, err := m.tokenizeChat(ctx, req, baseURL, mode)
	m.observe(res.Mode, start, err)
	return res, err
}

func (m *Model) tokenizeChat(ctx context.Context, req ChatRequest, baseURL string, mode Mode) (Result, error) {
	if mode == ModeRemote {
		return m.reg.remoteChat(ctx, m.name, req, baseURL)
	}
	prompt, ids, err := m.EncodeChat(req)
	if mode == ModeAuto {
		if err != nil && !errors.Is(err, ErrNoLocal) {
			// The local side failed; whether that is right (the template
			// raises for the pod too) only the pod can say.
			rres, rerr := m.reg.remoteChat(ctx, m.name, req, baseURL)
			if rerr == nil {
				m.switchToRemote("local_error", "local chat render failed where the pod's succeeded", err)
				return rres, nil
			}
			return Result{Mode: ModeLocal}, err
		}
		if err == nil && m.reg.sample() {
			req := req.detached()
			m.reg.compareInBackground(m, baseURL, func(ctx context.Context) (Result, error) {
				return m.reg.remoteChat(ctx, m.name, req, baseURL)
			}, prompt, ids)
		}
	}
	return Result{Prompt: prompt, IDs: ids, Mode: ModeLocal}, err
}

// TokenizePrompt returns the ids of a completion prompt according to the
// model's mode (see TokenizeChat).
func (m *Model) TokenizePrompt(ctx context.Context, prompt string, addSpecialTokens bool, baseURL string) (Result, error) {
	mode := m.promptMode()
	if m.reg == nil {
		mode = ModeLocal
	}
	start := time.Now()
	var res Result
	var err error
	if mode == ModeRemote {
		res, err = m.reg.remotePrompt(ctx, m.name, prompt, addSpecialTokens, baseURL)
	} else {
		var ids []uint32
		ids, err = m.Encode(prompt, addSpecialTokens)
		res = Result{Prompt: prompt, IDs: ids, Mode: ModeLocal}
		if err == nil && mode == ModeAuto && m.reg.sample() {
			m.reg.compareInBackground(m, baseURL, func(ctx context.Context) (Result, error) {
				return m.reg.remotePrompt(ctx, m.name, prompt, addSpecialTokens, baseURL)
			}, "", ids)
		}
	}
	m.observe(res.Mode, start, err)
	return res, err
}

func (m *Model) observe(mode Mode, start time.Time, err error) {
	if m.reg == nil {
		return
	}
	m.reg.metrics.requests.WithLabelValues(m.name, mode.String()).Inc()
	m.reg.metrics.seconds.WithLabelValues(m.name, mode.String()).Observe(time.Since(start).Seconds())
	if err != nil {
		m.reg.metrics.errors.WithLabelValues(m.name, mode.String()).Inc()
	}
}

// switchToRemote moves an auto model to remote for good: once the pod has
// disagreed, local ids would silently break prefix routing.
func (m *Model) switchToRemote(reason, why string, detail error) {
	if !m.mode.CompareAndSwap(int32(ModeAuto), int32(ModeRemote)) {
		return
	}
	m.reg.metrics.switches.WithLabelValues(m.name, reason).Inc()
	m.reg.metrics.setMode(m.name, ModeRemote)
	args := []any{"model", m.name, "reason", reason, "why", why}
	if detail != nil {
		args = append(args, "err", detail)
	}
	m.reg.log.Warn("tokenizer switched to remote mode", args...)
}

func (r *Registry) sample() bool {
	return r.opts.SampleRate >= 1 || rand.Float64() < r.opts.SampleRate
}

// compareInBackground checks a local result against the pod without
// delaying the request; a mismatch switches the model to remote.
func (r *Registry) compareInBackground(m *Model, baseURL string, remote func(context.Context) (Result, error), prompt string, ids []uint32) {
	if baseURL == "" {
		return
	}
	select {
	case r.compare <- struct{}{}:
	default:
		r.metrics.comparisons.WithLabelValues(m.name, "skipped").Inc()
		return
	}
	go func() {
		defer func() { <-r.compare }()
		ctx, cancel := context.WithTimeout(context.Background(), r.client.Timeout+time.Second)
		defer cancel()
		res, err := remote(ctx)
		switch {
		case err != nil:
			r.metrics.comparisons.WithLabelValues(m.name, "remote_error").Inc()
			r.log.Debug("tokenizer comparison: remote failed", "model", m.name, "err", err)
		case !slices.Equal(res.IDs, ids):
			r.metrics.comparisons.WithLabelValues(m.name, "mismatch").Inc()
			first := firstDiff(res.IDs, ids)
			m.switchToRemote("mismatch", fmt.Sprintf("local ids differ from the pod's at position %d (local %d ids, pod %d ids)", first, len(ids), len(res.IDs)), nil)
		case prompt != "" && res.Prompt != "" && res.Prompt != prompt:
			r.metrics.comparisons.WithLabelValues(m.name, "prompt_mismatch").Inc()
			m.switchToRemote("prompt_mismatch", fmt.Sprintf("local rendered prompt differs from the pod's at byte %d", firstDiff([]byte(prompt), []byte(res.Prompt))), nil)
		default:
			r.metrics.comparisons.WithLabelValues(m.name, "match").Inc()
		}
	}()
}

func firstDiff[T comparable](a, b []T) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
