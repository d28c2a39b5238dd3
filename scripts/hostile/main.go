// Command hostile attacks a live router as a hostile client would, on
// loopback, and prints what it measured: the router's resident memory
// under connections that declare huge bodies, how fast slow-header
// connections are closed, whether a normal request still answers beside
// them; then, on a second router collecting KV events on a bound socket
// and sharing with peers under a key, what forged and oversized KV
// events and a rogue peer change (events.go, peers.go). It starts the
// simulated pods and the routers it attacks (the binary given by -bin)
// and stops them when it is done. `make hostile` runs it;
// docs/performance.md records its figures.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	bin := flag.String("bin", "bin/prefixrouter", "the prefixrouter binary")
	conns := flag.Int("body-conns", 40, "connections declaring 32 MiB bodies")
	slow := flag.Int("slow-conns", 200, "connections sending half a request line")
	memLimit := flag.String("gomemlimit", "921MiB", "the router's GOMEMLIMIT, as serve sets it in a 1 GiB container (empty: none)")
	only := flag.String("only", "", "run one part only: front-door (clients) or events (KV events and peers); empty: both")
	flag.IntVar(&floodMessages, "flood", floodMessages, "KV-event messages just under the bus's 4 MiB bound sent from a forger's address")
	flag.Parse()
	if *memLimit != "" {
		routerEnv = append(routerEnv, "GOMEMLIMIT="+*memLimit)
	}
	if *only != "" && *only != "front-door" && *only != "events" {
		fmt.Fprintf(os.Stderr, "hostile: -only %q: want front-door or events\n", *only)
		os.Exit(2)
	}
	if *only != "events" {
		if err := run(*bin, *conns, *slow); err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			os.Exit(1)
		}
	}
	if *only != "front-door" {
		if err := runEvents(*bin); err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			os.Exit(1)
		}
	}
}

// routerEnv is added to the router's environment.
var routerEnv []string

// proc is a child process this command started, and stops.
type proc struct {
	cmd  *exec.Cmd
	out  *bufio.Scanner
	name string
}

func start(name, bin string, env []string, args ...string) (*proc, error) {
	return startLogging(name, bin, env, os.Stderr, args...)
}

// startLogging starts a child whose standard error goes to stderr.
func startLogging(name, bin string, env []string, stderr io.Writer, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{cmd: cmd, out: bufio.NewScanner(stdout), name: name}, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// rss is the process's resident memory in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// peakRSS samples pid's resident memory until stop is closed and returns
// the highest sample.
func peakRSS(pid int, stop <-chan struct{}) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		var peak int64
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			peak = max(peak, rss(pid))
			select {
			case <-stop:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitReady(url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready within 60 s", url)
}

// The keys of this run: the client's, and the one the pod wants from the
// router.
const (
	clientKey = "sk-hostile-run-client-key"
	podKey    = "sk-hostile-run-pod-key"
)

func completion(base string) (int, time.Duration, error) {
	return completionWithKey(base, clientKey)
}

func completionWithKey(base, key string) (int, time.Duration, error) {
	t0 := time.Now()
	q, err := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"model":"sim","prompt":"hello there","max_tokens":4}`))
	if err != nil {
		return 0, 0, err
	}
	q.Header.Set("Content-Type", "application/json")
	if key != "" {
		q.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(q)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, time.Since(t0), nil
}

func run(bin string, bodyConns, slowConns int) error {
	simPort, err := freePort()
	if err != nil {
		return err
	}
	evPort, err := freePort()
	if err != nil {
		return err
	}
	// Clients need a key; the pod wants the router's, as vLLM's --api-key.
	dir, err := os.MkdirTemp("", "hostile")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	keys, upstreamKey := dir+"/keys", dir+"/upstream"
	if err := os.WriteFile(keys, []byte(clientKey+" tenant-a\n"), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(upstreamKey, []byte(podKey+"\n"), 0o600); err != nil {
		return err
	}
	sim, err := start("sim", bin, nil, "sim", "--pods", "1", "--model", "sim", "--profile", "tiny", "--api-key", podKey,
		"--listen", fmt.Sprintf("127.0.0.1:%d", simPort), "--events-port", strconv.Itoa(evPort), "--log-level", "warn")
	if err != nil {
		return err
	}
	defer sim.stop()
	if !sim.out.Scan() {
		return errors.New("sim printed no endpoint")
	}
	endpoint := strings.TrimSpace(sim.out.Text())
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	admPort, err := freePort()
	if err != nil {
		return err
	}
	api := fmt.Sprintf("127.0.0.1:%d", apiPort)
	router, err := start("router", bin, routerEnv, "serve", "--endpoint", endpoint, "--listen", api,
		"--api-key-file", keys, "--upstream-api-key-file", upstreamKey,
		"--admin-listen", fmt.Sprintf("127.0.0.1:%d", admPort), "--log-level", "warn")
	if err != nil {
		return err
	}
	defer router.stop()
	base := "http://" + api
	if err := waitReady(base + "/ready"); err != nil {
		return err
	}
	pid := router.cmd.Process.Pid
	for range 20 {
		if _, _, err := completion(base); err != nil {
			return fmt.Errorf("warm-up request: %w", err)
		}
	}
	fmt.Printf("router pid %d in front of %s\n\n", pid, endpoint)
	if err := apiKeys(base); err != nil {
		return err
	}

	if err := declaredBodies(base, api, pid, bodyConns); err != nil {
		return err
	}
	if err := slowHeaders(api, slowConns); err != nil {
		return err
	}
	return nil
}

// apiKeys sends a request without a key, with a wrong one and with the
// right one.
func apiKeys(base string) error {
	fmt.Println("API keys (--api-key-file; the pod wants --upstream-api-key-file's key):")
	for _, c := range []struct{ name, key string }{{"no key", ""}, {"a wrong key", "sk-guess"}, {"the key", clientKey}} {
		status, _, err := completionWithKey(base, c.key)
		if err != nil {
			return err
		}
		fmt.Printf("  %s: HTTP %d\n", c.name, status)
	}
	fmt.Println()
	return nil
}

// declaredBodies opens n connections that each declare a 32 MiB body and
// send 1 KiB of it, then sends a normal request beside them.
func declaredBodies(base, api string, pid, n int) error {
	time.Sleep(time.Second)
	idle := rss(pid)
	stop := make(chan struct{})
	peak := peakRSS(pid, stop)
	var cs []net.Conn
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", api)
		if err != nil {
			return err
		}
		cs = append(cs, c)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 33554000\r\n\r\n", clientKey)
		if _, err := c.Write([]byte(`{"model":"sim","prompt":"` + strings.Repeat("x", 1000))); err != nil {
			return err
		}
	}
	time.Sleep(3 * time.Second)
	status, took, err := completion(base)
	if err != nil {
		return fmt.Errorf("normal request beside the body connections: %w", err)
	}
	time.Sleep(time.Second)
	close(stop)
	p := <-peak
	fmt.Printf("declared bodies: %d connections each declaring 32 MiB and sending 1 KiB\n", n)
	fmt.Printf("  router RSS idle %.1f MiB, peak %.1f MiB: +%.1f MiB (goal: at most +256 MiB)\n",
		mib(idle), mib(p), mib(p-idle))
	fmt.Printf("  a normal request beside them: HTTP %d in %s\n\n", status, took.Round(time.Millisecond))

	// The same connections sending their whole bodies: the budget refuses
	// what it cannot hold.
	for _, c := range cs {
		c.Close()
	}
	cs = nil
	time.Sleep(time.Second)
	idle = rss(pid)
	stop = make(chan struct{})
	peak = peakRSS(pid, stop)
	var mu sync.Mutex
	statuses := map[string]int{}
	var wg sync.WaitGroup
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'x'
	}
	for range n {
		wg.Go(func() {
			status := "no answer"
			defer func() { mu.Lock(); statuses[status]++; mu.Unlock() }()
			c, err := net.Dial("tcp", api)
			if err != nil {
				return
			}
			defer c.Close()
			const size = 32 << 20
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", clientKey, size)
			prefix := `{"model":"sim","max_tokens":1,"prompt":"`
			_, _ = c.Write([]byte(prefix))
			left := size - len(prefix) - 2
			for left > 0 {
				m := min(left, len(chunk))
				if _, err := c.Write(chunk[:m]); err != nil {
					break
				}
				left -= m
			}
			_, _ = c.Write([]byte(`"}`))
			_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			if f := strings.Fields(line); len(f) >= 2 {
				status = "HTTP " + f[1]
			}
		})
	}
	wg.Wait()
	close(stop)
	p = <-peak
	fmt.Printf("whole bodies: %d connections each sending 32 MiB\n", n)
	fmt.Printf("  router RSS idle %.1f MiB, peak %.1f MiB: +%.1f MiB; answers %v\n\n", mib(idle), mib(p), mib(p-idle), statuses)
	return nil
}

// slowHeaders opens n connections that send half a request line and then
// nothing, and counts those the router closed within 20 s.
func slowHeaders(api string, n int) error {
	var closed atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	var last atomic.Int64
	for range n {
		c, err := net.Dial("tcp", api)
		if err != nil {
			return err
		}
		fmt.Fprint(c, "POST /v1/compl")
		wg.Go(func() {
			defer c.Close()
			deadline, _ := ctx.Deadline()
			_ = c.SetReadDeadline(deadline)
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				closed.Add(1)
				last.Store(int64(time.Since(t0)))
			}
		})
	}
	wg.Wait()
	fmt.Printf("slow headers: %d connections sending half a request line\n", n)
	fmt.Printf("  closed by the router within 20 s: %d (%.0f%%; goal: at least 90%%), the last after %s\n\n",
		closed.Load(), 100*float64(closed.Load())/float64(n), time.Duration(last.Load()).Round(100*time.Millisecond))
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
