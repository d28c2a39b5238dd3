package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/peers"
)

// clearEnv unsets every PREFIXROUTER_ variable for the test (restored
// after it), so that the shell running the tests cannot change them.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PREFIXROUTER_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

// wantUsageLine runs the CLI and expects exit status 2, nothing on stdout
// and exactly the line want on stderr. Bad input is refused before
// anything starts; a command that starts anyway is stopped after 20 s.
func wantUsageLine(t *testing.T, want string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, append([]string{"prefixrouter"}, args...), strings.NewReader(""), &out, &errOut)
	if code != exitUsage || out.String() != "" || errOut.String() != "prefixrouter: "+want+"\n" {
		t.Fatalf("prefixrouter %q: exit %d, stdout %q, stderr %q\nwant exit 2 and stderr %q", args, code, out.String(), errOut.String(), "prefixrouter: "+want+"\n")
	}
}

func TestUnknownFlagsAndCommandsNameWhatWasMeant(t *testing.T) {
	clearEnv(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--hash-sed", "0"}, "unknown flag --hash-sed (did you mean --hash-seed?)"},
		{[]string{"serve", "--max_retries", "1"}, "unknown flag --max_retries (did you mean --max-retries?)"},
		{[]string{"serve", "--tokeniser", "m=bytes"}, "unknown flag --tokeniser (did you mean --tokenizer?)"},
		{[]string{"serve", "--idle", "1s"}, "unknown flag --idle (did you mean --idle-timeout?)"},
		{[]string{"hash", "--sed", "0"}, "unknown flag --sed (did you mean --hash-seed?)"},
		{[]string{"hash", "--seed", "0"}, "unknown flag --seed (renamed --hash-seed)"},
		{[]string{"hash", "--algo", "xxhash"}, "unknown flag --algo (renamed --hash-algo)"},
		{[]string{"sim", "--seed", "7"}, "unknown flag --seed (renamed --fault-seed)"},
		{[]string{"events", "--endpont", "tcp://h:5557"}, "unknown flag --endpont (did you mean --endpoint?)"},
		{[]string{"serve", "--count", "3"}, "unknown flag --count (a flag of events)"},
		{[]string{"--endpoint", "http://h:8000", "serve"}, "unknown flag --endpoint (a flag of serve or events)"},
		{[]string{"serve", "--bogus"}, "unknown flag --bogus"},
		{[]string{"serv"}, "unknown command serv (did you mean serve?)"},
		{[]string{"evnets"}, "unknown command evnets (did you mean events?)"},
		{[]string{"route"}, "unknown command route (commands: hash, serve, demo, bench, sim, events, tokenize, ttl-advise, peer-keygen, version, help, h)"},
		{[]string{"help", "serv"}, "unknown command serv (did you mean serve?)"},
		{[]string{"help", "serve", "sim"}, `unexpected argument "sim" (help takes one command)`},
		{[]string{"serve", "http://h:8000"}, `unexpected argument "http://h:8000" (give every value with its flag, e.g. --NAME VALUE)`},
		{[]string{"serve", "--policy"}, "--policy needs a value"},
		{[]string{"ttl-advise", "--latencies", "-", "-h", "0"}, `unexpected argument "0" (give every value with its flag, e.g. --NAME VALUE)`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			wantUsageLine(t, tc.want, tc.args...)
		})
	}
}

// TestNumbersAreTyped: counts, sizes and durations are numbers in every
// command, so help says what they take and a bad value is refused by the
// parser, on the command line and in the environment alike.
func TestNumbersAreTyped(t *testing.T) {
	clearEnv(t)
	types := map[string]map[string]string{
		"hash":   {"block-size": "int"},
		"events": {"count": "uint", "timeout": "duration"},
		"demo":   {"pods": "int", "timeout": "duration"},
		"sim":    {"pods": "int", "block-size": "int", "fault-seed": "uint", "event-delay": "duration"},
		"serve":  {"block-size": "int", "idle-timeout": "duration"},
	}
	for _, c := range newApp(nil, io.Discard, io.Discard).Commands {
		for name, want := range types[c.Name] {
			f := findFlag(c, name)
			if f == nil {
				t.Errorf("%s has no --%s", c.Name, name)
				continue
			}
			if got := f.(cli.DocGenerationFlag).TypeName(); got != want {
				t.Errorf("%s --%s takes %s, want %s", c.Name, name, got, want)
			}
		}
	}
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"hash", "--block-size", "x"}, nil, `--block-size: "x" is not an integer`},
		{[]string{"hash", "--hash-seed", "0"}, map[string]string{"PREFIXROUTER_HASH_BLOCK_SIZE": "16k"}, `PREFIXROUTER_HASH_BLOCK_SIZE (--block-size): "16k" is not an integer`},
		{[]string{"events", "--count", "-1"}, nil, `--count: "-1" is not a non-negative integer`},
		{[]string{"events", "--count", "1.5"}, nil, `--count: "1.5" is not a non-negative integer`},
		{[]string{"events"}, map[string]string{"PREFIXROUTER_EVENTS_COUNT": "ten"}, `PREFIXROUTER_EVENTS_COUNT (--count): "ten" is not a non-negative integer`},
		{[]string{"events", "--timeout", "soon"}, nil, `--timeout: "soon" is not a duration (like 500ms, 30s or 2m)`},
		{[]string{"events", "--timeout", "-1s"}, nil, `--timeout: must not be negative, got -1s`},
		{[]string{"events"}, map[string]string{"PREFIXROUTER_EVENTS_TIMEOUT": "30"}, `PREFIXROUTER_EVENTS_TIMEOUT (--timeout): "30" is not a duration (like 500ms, 30s or 2m)`},
		{[]string{"demo", "--timeout", "0s"}, nil, `--timeout must be positive, got 0s`},
		{[]string{"demo"}, map[string]string{"PREFIXROUTER_DEMO_PODS": "four"}, `PREFIXROUTER_DEMO_PODS (--pods): "four" is not an integer`},
		{[]string{"sim", "--fault-seed", "-3"}, nil, `--fault-seed: "-3" is not a non-negative integer`},
		{[]string{"sim", "--pods", "99999999999999999999"}, nil, `--pods: "99999999999999999999" is out of range`},
		{[]string{"sim"}, map[string]string{"PREFIXROUTER_SIM_LEGACY_REPLAY": "maybe"}, `PREFIXROUTER_SIM_LEGACY_REPLAY (--legacy-replay): "maybe" is not true or false`},
		{[]string{"hash", "--format", "b64"}, nil, `--format: unknown value "b64" (want u64 or hex)`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			wantUsageLine(t, tc.want, tc.args...)
		})
	}
}

func findFlag(c *cli.Command, name string) cli.Flag {
	for _, f := range c.Flags {
		if f.Names()[0] == name {
			return f
		}
	}
	return nil
}

// TestMalformedEnvironmentExitsTwo: a variable that does not parse is bad
// input (exit 2, one line naming it), every one of them at once, and
// before anything starts.
func TestMalformedEnvironmentExitsTwo(t *testing.T) {
	clearEnv(t)
	t.Setenv("PREFIXROUTER_IDLE_TIMEOUT", "soon")
	wantUsageLine(t, `PREFIXROUTER_IDLE_TIMEOUT (--idle-timeout): "soon" is not a duration (like 500ms, 30s or 2m)`,
		"serve", "--endpoint", "http://127.0.0.1:1")
	t.Setenv("PREFIXROUTER_POLICY", "fastest")
	t.Setenv("PREFIXROUTER_MAX_RETRIES", "two")
	t.Setenv("PREFIXROUTER_HASH_ALGO", "md5")
	wantUsageLine(t, `PREFIXROUTER_HASH_ALGO (--hash-algo): unknown hash algorithm "md5" (want one of sha256, sha256_cbor, xxhash, xxhash_cbor); `+
		`PREFIXROUTER_IDLE_TIMEOUT (--idle-timeout): "soon" is not a duration (like 500ms, 30s or 2m); `+
		`PREFIXROUTER_MAX_RETRIES (--max-retries): "two" is not an integer; `+
		`PREFIXROUTER_POLICY (--policy): unknown policy "fastest" (want round-robin, least-load, approximate, precise or speculative)`,
		"serve", "--endpoint", "http://127.0.0.1:1")
	// An empty variable of a value learned from the pods is that value.
	clearEnv(t)
	t.Setenv("PREFIXROUTER_HASH_ALGO", "")
	wantUsageLine(t, "--max-retries must not be negative", "serve", "--endpoint", "http://127.0.0.1:1", "--max-retries", "-1")
	t.Setenv("PREFIXROUTER_POLICY", "")
	t.Setenv("PREFIXROUTER_DEBUG_HEADERS", "")
	t.Setenv("PREFIXROUTER_MAX_RETRIES", "")
	wantUsageLine(t, `PREFIXROUTER_POLICY (--policy): unknown policy "" (want round-robin, least-load, approximate, precise or speculative)`,
		"serve", "--endpoint", "http://127.0.0.1:1")
	// A flag on the command line wins: its variable is not read.
	clearEnv(t)
	t.Setenv("PREFIXROUTER_EVENTS_COUNT", "ten")
	wantUsageLine(t, "--endpoint is required, e.g. tcp://10.0.0.7:5557", "events", "--count", "1")
}

// TestUnreadEnvironmentVariablesAreNamed: a PREFIXROUTER_ variable no
// command reads is a typo or an old name: a warning names the one meant,
// and the command runs. Kubernetes' variables for a Service named
// prefixrouter are not warned of.
func TestUnreadEnvironmentVariablesAreNamed(t *testing.T) {
	clearEnv(t)
	t.Setenv("PREFIXROUTER_TIME_SCALE", "100")
	t.Setenv("PREFIXROUTER_HASHSEED", "0")
	for _, k := range []string{"PREFIXROUTER_SERVICE_HOST", "PREFIXROUTER_SERVICE_PORT", "PREFIXROUTER_SERVICE_PORT_API",
		"PREFIXROUTER_PORT", "PREFIXROUTER_PORT_8000_TCP", "PREFIXROUTER_PORT_8000_TCP_ADDR"} {
		t.Setenv(k, "10.0.0.1")
	}
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"prefixrouter", "version"}, strings.NewReader(""), &out, &errOut)
	want := "prefixrouter: warning: PREFIXROUTER_HASHSEED is read by no command (did you mean PREFIXROUTER_HASH_SEED?)\n" +
		"prefixrouter: warning: PREFIXROUTER_TIME_SCALE is read by no command (did you mean PREFIXROUTER_DEMO_TIME_SCALE or PREFIXROUTER_BENCH_TIME_SCALE or PREFIXROUTER_SIM_TIME_SCALE?)\n"
	if code != 0 || out.String() != version+"\n" || errOut.String() != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0, the version, and stderr %q", code, out.String(), errOut.String(), want)
	}
}

// TestEnvironmentVariablesAreUnique: every flag of every command has one
// variable, named by the scheme (serve: PREFIXROUTER_<FLAG>, the others:
// PREFIXROUTER_<COMMAND>_<FLAG>), and no two flags share one, so that
// setting one command's cannot change another's.
func TestEnvironmentVariablesAreUnique(t *testing.T) {
	owner := map[string]string{}
	for _, c := range newApp(nil, io.Discard, io.Discard).Commands {
		for _, f := range c.Flags {
			name := f.Names()[0]
			vars := f.(cli.DocGenerationFlag).GetEnvVars()
			if len(vars) != 1 || vars[0] != envName(c.Name, name) {
				t.Errorf("%s --%s reads %q, want [%s]", c.Name, name, vars, envName(c.Name, name))
				continue
			}
			if o, ok := owner[vars[0]]; ok {
				t.Errorf("%s is read by %s and by %s --%s", vars[0], o, c.Name, name)
			}
			owner[vars[0]] = c.Name + " --" + name
		}
	}
}

// TestServeEnvironmentDoesNotReachTools: the router's variables, set where
// a tool runs, change nothing of the tool (PREFIXROUTER_TOKENIZER was read
// by serve, sim and tokenize alike).
func TestServeEnvironmentDoesNotReachTools(t *testing.T) {
	clearEnv(t)
	t.Setenv("PREFIXROUTER_TOKENIZER", "sim-tiny=/nonexistent/tokenizer")
	t.Setenv("PREFIXROUTER_HASH_ALGO", "xxhash")
	t.Setenv("PREFIXROUTER_BLOCK_SIZE", "7")
	t.Setenv("PREFIXROUTER_LISTEN", "not an address")
	t.Setenv("PREFIXROUTER_LOG_LEVEL", "loud")

	t.Run("tokenize", func(t *testing.T) {
		out, errOut, code := runCLI(t, `"hi"`, "tokenize")
		if code != exitUsage || errOut != "prefixrouter: --tokenizer is required\n" {
			t.Fatalf("exit %d stdout %q stderr %q: serve's PREFIXROUTER_TOKENIZER reached tokenize", code, out, errOut)
		}
		t.Setenv("PREFIXROUTER_TOKENIZE_TOKENIZER", "bytes")
		out, errOut, code = runCLI(t, `"hi"`, "tokenize")
		if code != 0 || out != "[104,105]\n" {
			t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
		}
	})
	t.Run("hash", func(t *testing.T) {
		// sha256 and block size 4: serve's xxhash and 7 must not apply.
		out, errOut, code := runCLI(t, "", "hash", "--hash-seed", "0", "--block-size", "4", "--tokens", "1,2,3,4")
		if code != 0 || out != "10362225831949560093\n" {
			t.Fatalf("exit %d stdout %q stderr %q", code, out, errOut)
		}
	})
	t.Run("sim", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		lines, wait := startSim(ctx, t, 1, "--profile", "tiny", "--listen", "127.0.0.1:0", "--events-port", "0")
		cancel()
		if code, stderr := wait(); code != 0 {
			t.Fatalf("sim exit %d: %s", code, stderr)
		}
		if !strings.Contains(lines[0], "model=sim-tiny") {
			t.Fatalf("endpoint %q", lines[0])
		}
	})
}

// TestHelpPrintsOneDefaultPerFlag: a help line names its default once, in
// the "(default: …)" the flag table prints.
func TestHelpPrintsOneDefaultPerFlag(t *testing.T) {
	clearEnv(t)
	for _, c := range newApp(nil, io.Discard, io.Discard).Commands {
		out, errOut, code := runCLI(t, "", c.Name, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d %s", c.Name, code, errOut)
		}
		for _, line := range strings.Split(out, "\n") {
			var words []string // without the flag's name and variable
			for _, w := range strings.Fields(line) {
				if !strings.HasPrefix(w, "--") && !strings.HasPrefix(w, "[$") {
					words = append(words, w)
				}
			}
			if n := strings.Count(strings.ToLower(strings.Join(words, " ")), "default"); n > 1 {
				t.Errorf("%s --help: %d defaults in %q", c.Name, n, strings.TrimSpace(line))
			}
		}
	}
}

// TestHashSeedRandom: "random" means PYTHONHASHSEED unset everywhere. sim
// simulates such pods (TestSimRunsUntilCancelled); serve and hash cannot
// compute their hashes and refuse it, serve pointing to token-derived mode.
func TestHashSeedRandom(t *testing.T) {
	clearEnv(t)
	const why = `"random" means pods without PYTHONHASHSEED, whose block hashes are random per process and cannot be recomputed: `
	wantUsageLine(t, "--hash-seed: "+why+"omit --hash-seed, and the router keys blocks by their tokens (token-derived mode)",
		"serve", "--endpoint", "http://127.0.0.1:1", "--hash-seed", "random")
	wantUsageLine(t, "--hash-seed: "+why+"start the pods with PYTHONHASHSEED set to compare their hashes",
		"hash", "--hash-seed", "random", "--block-size", "4", "--tokens", "1,2,3,4")
	t.Setenv("PREFIXROUTER_HASH_SEED", "random")
	wantUsageLine(t, "PREFIXROUTER_HASH_SEED (--hash-seed): "+why+"omit --hash-seed, and the router keys blocks by their tokens (token-derived mode)",
		"serve", "--endpoint", "http://127.0.0.1:1")
}

// FuzzHashCommandLine: whatever the arguments, the hash command answers
// with an exit status of 0, 1 or 2, at most one line on stderr, and nothing
// on stdout when it fails; it never panics.
func FuzzHashCommandLine(f *testing.F) {
	f.Add("--hash-seed", "0", "--block-size=4", "--tokens=1,2,3,4,5")
	f.Add("--hash-sed", "0", "--blocksize", "x")
	f.Add("--tokens", "", "--format", "hex")
	f.Add("--block-size", "99999999999999999999", "extra", "--")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		var out, errOut bytes.Buffer
		args := []string{"prefixrouter", "hash", "--hash-seed", "0", "--block-size", "4", a, b, c, d}
		code := run(context.Background(), args, strings.NewReader(""), &out, &errOut)
		if code < 0 || code > 2 {
			t.Fatalf("%q: exit %d", args, code)
		}
		if n := strings.Count(errOut.String(), "\n"); n > 1 {
			t.Fatalf("%q: %d lines on stderr: %q", args, n, errOut.String())
		}
		if code != 0 && out.Len() > 0 {
			t.Fatalf("%q: exit %d with stdout %q", args, code, out.String())
		}
	})
}

// TestBadPeersExitTwo: a --peers entry that is neither form, or peers
// without --peer-listen, is one usage line naming the flag.
func TestBadPeersExitTwo(t *testing.T) {
	clearEnv(t)
	wantUsageLine(t, `--peers "10.0.0.5:5571": want tcp://HOST:PORT or dns:NAME:PORT`,
		"serve", "--endpoint", "http://127.0.0.1:1", "--peer-listen", "tcp://127.0.0.1:5571", "--peer-insecure", "--peers", "10.0.0.5:5571")
	wantUsageLine(t, "--peer-listen needs --peer-key-file PATH, the CURVE keypair the replicas share (`prefixrouter peer-keygen` writes one), or --peer-insecure to let anyone who reaches the port read the mesh and any process at a --peers address steer it",
		"serve", "--endpoint", "http://127.0.0.1:1", "--peer-listen", "tcp://127.0.0.1:5571")
	bad := filepath.Join(t.TempDir(), "peer.key")
	if err := os.WriteFile(bad, []byte("secret=abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantUsageLine(t, "router: --peer-key-file "+bad+": line 1: secret is not a 40-character Z85 key",
		"serve", "--endpoint", "http://127.0.0.1:1", "--peer-listen", "tcp://127.0.0.1:5571", "--peer-key-file", bad)
	t.Setenv("PREFIXROUTER_PEERS", "tcp://10.0.0.5:5571,dns:routers.default.svc:5571")
	wantUsageLine(t, "--peers needs --peer-listen: replicas share with each other, so each must publish too",
		"serve", "--endpoint", "http://127.0.0.1:1")
}

// TestPeerKeygen: the command writes a key file serve reads, to a file
// it creates (mode 0600, never overwritten) or to standard output.
func TestPeerKeygen(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "peer.key")
	if _, errOut, code := runCLI(t, "", "peer-keygen", "--out", path); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	k, err := peers.LoadKey(path)
	if err != nil {
		t.Fatal(err)
	}
	wantUsageLine(t, "--out "+path+" exists: a key is never overwritten (the replicas holding it would be shut out)",
		"peer-keygen", "--out", path)
	if again, err := peers.LoadKey(path); err != nil || again != k {
		t.Fatalf("the key changed: %v", err)
	}
	out, _, code := runCLI(t, "", "peer-keygen")
	other, err := peers.ParseKey([]byte(out))
	if code != 0 || err != nil || other == k {
		t.Fatalf("standard output: exit %d, %v, same key %v", code, err, other == k)
	}
}
