package health

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.yaml.in/yaml/v3"
)

// fileDebounce lets an editor finish writing before the file is re-read.
const fileDebounce = 100 * time.Millisecond

// maxEndpointsFile bounds the endpoints file.
const maxEndpointsFile = 4 << 20

// ParseEndpointsFile parses an endpoints file: a YAML (or JSON, which YAML
// reads too) list of endpoint specs, either bare or under an "endpoints"
// key:
//
//   - http://10.0.0.7:8000?dp=2
//
//   - http://10.0.0.8:8000?model=llama&replay=tcp://10.0.0.8:5558
//
//     {"endpoints": ["http://10.0.0.7:8000"]}
//
// An explicitly empty list is valid (no targets); an empty or blank file is
// an error, so that a file caught mid-write does not drain the fleet.
func ParseEndpointsFile(data []byte) ([]Spec, error) {
	if len(data) > maxEndpointsFile {
		return nil, fmt.Errorf("endpoints file larger than %d bytes", maxEndpointsFile)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("endpoints file is empty (write [] for no endpoints)")
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	if mp, ok := doc.(map[string]any); ok {
		list, ok := mp["endpoints"]
		if !ok || len(mp) != 1 {
			return nil, errors.New(`endpoints file: want a list of specs or {"endpoints": [...]}`)
		}
		doc = list
	}
	if doc == nil {
		return nil, errors.New("endpoints file: no list")
	}
	list, ok := doc.([]any)
	if !ok {
		return nil, fmt.Errorf("endpoints file: want a list of specs, got %T", doc)
	}
	out := make([]Spec, 0, len(list))
	seen := map[string]bool{}
	for i, item := range list {
		s, ok := item.(string)
		if !ok {
			return nil, fmt.Errorf("endpoints file: item %d: want a spec string, got %T", i, item)
		}
		spec, err := ParseSpec(s)
		if err != nil {
			return nil, fmt.Errorf("endpoints file: item %d %q: %w", i, s, err)
		}
		if seen[spec.Endpoint] {
			return nil, fmt.Errorf("endpoints file: item %d: %s listed twice", i, spec.Endpoint)
		}
		seen[spec.Endpoint] = true
		out = append(out, spec)
	}
	return out, nil
}

// reloadFile re-reads the endpoints file and applies it when its content
// changed. An unreadable or invalid file keeps the previous targets.
func (m *Monitor) reloadFile() error {
	path := m.cfg.EndpointsFile
	data, err := readBounded(path, maxEndpointsFile)
	if err == nil {
		sum := sha256.Sum256(data)
		m.mu.Lock()
		st := m.statusLocked(SourceFile)
		same := st.haveHash && st.hash == sum
		m.mu.Unlock()
		if same {
			return nil
		}
		var specs []Spec
		if specs, err = ParseEndpointsFile(data); err == nil {
			set := make(map[string]Spec, len(specs))
			for _, s := range specs {
				set[s.Endpoint] = s
			}
			m.setSource(SourceFile, set)
			m.mu.Lock()
			st.hash, st.haveHash = sum, true
			m.mu.Unlock()
			m.sourceOK(SourceFile, len(set), path)
			m.met.reloads.WithLabelValues(SourceFile).Inc()
			return nil
		}
	}
	err = fmt.Errorf("endpoints file %s: %w", path, err)
	m.sourceErr(SourceFile, err)
	return err
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return buf.Bytes(), nil
}

// watchFile re-reads the endpoints file on fsnotify events in its directory
// (which catches atomic renames and Kubernetes ConfigMap symlink swaps),
// debounced, and on a polling interval as a fallback.
func (m *Monitor) watchFile(ctx context.Context) {
	path := m.cfg.EndpointsFile
	var events <-chan fsnotify.Event
	var errs <-chan error
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(filepath.Dir(path)); err != nil {
			w.Close()
		}
	}
	if err != nil {
		m.log.Warn("endpoints file: watching unavailable, polling only", "path", path, "every", m.cfg.FilePollInterval, "err", err)
	} else {
		defer w.Close()
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(m.cfg.FilePollInterval)
	defer poll.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	reload := func() {
		if err := m.reloadFile(); err != nil {
			m.log.Warn("endpoints file not applied; keeping previous targets", "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
			reload()
		case <-debounce.C:
			reload()
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			debounce.Reset(fileDebounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			m.log.Warn("endpoints file watcher", "err", err)
		}
	}
}

// resolveAll resolves every --discover-dns name and applies the union. A
// name that fails to resolve keeps its previous addresses (a DNS outage must
// not drain the fleet); a successful empty answer removes them.
func (m *Monitor) resolveAll(ctx context.Context) {
	timeout := min(m.cfg.DNSInterval, 5*time.Second)
	m.mu.Lock()
	prev := m.dnsLast
	m.mu.Unlock()
	next := make(map[string]map[string]Spec, len(m.dnsSpecs))
	var failed []error
	for _, d := range m.dnsSpecs {
		key := fmt.Sprintf("%s:%d", d.Name, d.Port)
		rctx, cancel := context.WithTimeout(ctx, timeout)
		addrs, err := m.resolver.LookupHost(rctx, d.Name)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failed = append(failed, fmt.Errorf("resolving %s: %w", d.Name, err))
			next[key] = prev[key]
			continue
		}
		slices.Sort(addrs)
		addrs = slices.Compact(addrs)
		set := map[string]Spec{}
		for _, a := range addrs {
			spec, err := d.SpecFor(a)
			if err != nil {
				failed = append(failed, err)
				continue
			}
			set[spec.Endpoint] = spec
		}
		if len(set) == 0 {
			m.log.Warn("dns discovery: no addresses", "name", d.Name)
		}
		next[key] = set
	}
	merged := map[string]Spec{}
	for _, key := range slices.Sorted(maps.Keys(next)) {
		for ep, s := range next[key] {
			if _, dup := merged[ep]; !dup {
				merged[ep] = s
			}
		}
	}
	m.mu.Lock()
	m.dnsLast = next
	m.mu.Unlock()
	m.setSource(SourceDNS, merged)
	m.met.reloads.WithLabelValues(SourceDNS).Inc()
	if err := errors.Join(failed...); err != nil {
		m.sourceErr(SourceDNS, err)
		return
	}
	m.sourceOK(SourceDNS, len(merged), fmt.Sprint(len(m.dnsSpecs), " names"))
}

func (m *Monitor) statusLocked(src string) *SourceStatus {
	st := m.srcStatus[src]
	if st == nil {
		st = &SourceStatus{Source: src}
		m.srcStatus[src] = st
	}
	return st
}

func (m *Monitor) sourceOK(src string, n int, detail string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.statusLocked(src)
	st.Endpoints, st.LastOK, st.LastError, st.Detail = n, m.now(), "", detail
}

func (m *Monitor) sourceErr(src string, err error) {
	m.met.discoveryErrors.WithLabelValues(src).Inc()
	m.log.Warn("discovery error", "source", src, "err", err)
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.statusLocked(src)
	st.LastError, st.LastErrAt = err.Error(), m.now()
}
