package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the binary's entry point in-process.
func runCLI(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), append([]string{"prefixrouter"}, args...), strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func TestHashCommandGolden(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "vllm", "block_hashes.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		BaseTokens []int `json:"base_tokens"`
		Cases      []struct {
			ID        string  `json:"id"`
			Algo      string  `json:"algo"`
			Seed      string  `json:"pythonhashseed"`
			BlockSize int     `json:"block_size"`
			NumTokens int     `json:"num_tokens"`
			Tokens    []int   `json:"tokens"`
			LoRAName  *string `json:"lora_name"`
			CacheSalt *string `json:"cache_salt"`
			Note      string  `json:"note"`
			Blocks    []struct {
				HashHex string `json:"hash_hex"`
				HashU64 string `json:"hash_u64"`
			} `json:"blocks"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for i, c := range g.Cases {
		if c.Note != "" {
			continue // multimodal keys are not expressible on the command line
		}
		tokens := c.Tokens
		if tokens == nil {
			tokens = g.BaseTokens[:c.NumTokens]
		}
		file := filepath.Join(dir, "tokens.json")
		b, _ := json.Marshal(tokens)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"hash", "--hash-algo", c.Algo, "--hash-seed", c.Seed, "--block-size", itoa(c.BlockSize), "--tokens-file", file}
		if c.LoRAName != nil {
			args = append(args, "--lora-name", *c.LoRAName)
		}
		if c.CacheSalt != nil {
			args = append(args, "--cache-salt", *c.CacheSalt)
		}
		var wantU64, wantHex strings.Builder
		for _, blk := range c.Blocks {
			wantU64.WriteString(blk.HashU64 + "\n")
			wantHex.WriteString(blk.HashHex + "\n")
		}
		out, errOut, code := runCLI(t, "", args...)
		if code != 0 || out != wantU64.String() {
			t.Fatalf("case %d %s: code %d stderr %q\n got %q\nwant %q", i, c.ID, code, errOut, out, wantU64.String())
		}
		out, _, code = runCLI(t, "", append(args, "--format", "hex")...)
		if code != 0 || out != wantHex.String() {
			t.Fatalf("case %s hex: got %q want %q", c.ID, out, wantHex.String())
		}
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestHashCommandContract(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		code     int
		stdout   string
		errMatch string
	}{
		{"inline tokens", []string{"--hash-algo", "sha256_cbor", "--hash-seed", "0", "--block-size", "4", "--tokens", "1,2,3,4,5,6,7,8"}, 0,
			"2164874634404590027\n17270480062156288726\n", ""},
		{"partial block prints nothing", []string{"--hash-seed", "0", "--block-size", "4", "--tokens", "1,2,3"}, 0, "", ""},
		{"unknown algorithm", []string{"--hash-algo", "md5", "--hash-seed", "0", "--block-size", "4", "--tokens", "1"}, 2, "", "unknown hash algorithm"},
		{"non-numeric token", []string{"--hash-seed", "0", "--block-size", "4", "--tokens", "1,x"}, 2, "", "not a token id"},
		{"negative block size", []string{"--hash-seed", "0", "--block-size", "-4", "--tokens", "1"}, 2, "", "must be positive"},
		{"missing seed", []string{"--block-size", "4", "--tokens", "1"}, 2, "", "--hash-seed is required"},
		{"missing tokens", []string{"--hash-seed", "0", "--block-size", "4"}, 2, "", "--tokens"},
		{"bad format", []string{"--hash-seed", "0", "--block-size", "4", "--tokens", "1", "--format", "b64"}, 2, "", "--format"},
		{"unknown flag", []string{"--bogus"}, 2, "", "bogus"},
		{"missing tokens file", []string{"--hash-seed", "0", "--block-size", "4", "--tokens-file", "/nonexistent/x.json"}, 2, "", "--tokens-file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runCLI(t, "", append([]string{"hash"}, c.args...)...)
			if code != c.code || out != c.stdout {
				t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
			}
			if c.errMatch != "" {
				if !strings.Contains(errOut, c.errMatch) || strings.Count(errOut, "\n") != 1 {
					t.Fatalf("stderr %q: want one line mentioning %q", errOut, c.errMatch)
				}
			}
		})
	}
}

// TestHashShortInputSaysSoOnStderr: fewer tokens than one block have no
// block hash (vLLM hashes full blocks only), so stdout stays empty and the
// exit status 0, but stderr says why nothing was printed.
func TestHashShortInputSaysSoOnStderr(t *testing.T) {
	for _, tc := range []struct{ tokens, note string }{
		{"1,2,3", "prefixrouter: 3 tokens do not fill one block of 4: no block hashes\n"},
		{"", "prefixrouter: 0 tokens do not fill one block of 4: no block hashes\n"},
	} {
		out, errOut, code := runCLI(t, "", "hash", "--hash-seed", "0", "--block-size", "4", "--tokens", tc.tokens)
		if code != 0 || out != "" || errOut != tc.note {
			t.Errorf("--tokens %q: exit %d stdout %q stderr %q, want exit 0, no stdout, stderr %q", tc.tokens, code, out, errOut, tc.note)
		}
	}
	// A full block prints its hash and nothing on stderr.
	out, errOut, code := runCLI(t, "", "hash", "--hash-seed", "0", "--block-size", "4", "--tokens", "1,2,3,4,5")
	if code != 0 || strings.Count(out, "\n") != 1 || errOut != "" {
		t.Errorf("one full block: exit %d stdout %q stderr %q", code, out, errOut)
	}
}

func FuzzParseTokenList(f *testing.F) {
	for _, s := range []string{"", "1,2,3", " 4 , 5", "1,,2", "-1", "4294967296", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := parseTokenList(s)
		if err != nil {
			return
		}
		// Whatever parses must print back to an equivalent list.
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = itoa(int(id))
		}
		again, err := parseTokenList(strings.Join(parts, ","))
		if err != nil || len(again) != len(ids) {
			t.Fatalf("round trip of %q: %v %v", s, again, err)
		}
	})
}
