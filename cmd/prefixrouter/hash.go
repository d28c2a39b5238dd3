package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

// hashSettings is what the hash command's flags set.
type hashSettings struct {
	HashAlgo    kvindex.HashAlgo
	HashSeed    string
	HasHashSeed bool
	BlockSize   int
	LoRAName    string
	CacheSalt   string
	Tokens      string
	HasTokens   bool
	TokensFile  string
	Format      string
}

// hashCommand writes its notes (not errors) to stderr.
func hashCommand(stderr io.Writer) *cli.Command {
	s := hashSettings{HashAlgo: kvindex.AlgoSHA256, Format: "u64"}
	t := newFlagTable("hash")
	t.rename("seed", "hash-seed")
	t.rename("algo", "hash-algo")
	b := t.group("")
	return t.command(&cli.Command{
		Name:  "hash",
		Usage: "print vLLM prefix-cache block hashes for a token sequence",
		Description: "Computes the block hashes a vLLM pod publishes in its KV events for the given tokens,\n" +
			"one line per full block, as unsigned decimal (the event wire value) or, with --format hex,\n" +
			"the full digest. Compare them with `prefixrouter events` output to check that the router's\n" +
			"algorithm, seed and block size agree with the pods. Fewer tokens than one block print\n" +
			"nothing on stdout and say so on stderr.",
		Flags: []cli.Flag{
			choice(b, "hash-algo", "the pods' --prefix-caching-hash-algo: "+strings.Join(kvindex.HashAlgoNames(), ", "), &s.HashAlgo, kvindex.HashAlgo.String, kvindex.ParseHashAlgo),
			b.optional("hash-seed", "the pods' PYTHONHASHSEED", "none, required", &s.HashSeed, &s.HasHashSeed,
				refuseRandomSeed("start the pods with PYTHONHASHSEED set to compare their hashes")),
			defaultText(b.int("block-size", "the pods' KV block size in tokens", &s.BlockSize), "none, required"),
			b.str("lora-name", "LoRA adapter name (extra key on every block)", &s.LoRAName),
			b.str("cache-salt", "request cache_salt (extra key on block 0)", &s.CacheSalt),
			b.optional("tokens", "comma-separated token ids", "none", &s.Tokens, &s.HasTokens, nil),
			b.str("tokens-file", "file holding a JSON array of token ids", &s.TokensFile),
			choice(b, "format", "output: u64 (event wire value) or hex (full digest)", &s.Format, identity, oneOf("u64", "hex")),
		},
		Action: func(_ context.Context, cmd *cli.Command) error { return runHash(cmd.Root().Writer, stderr, &s) },
	})
}

func runHash(stdout, stderr io.Writer, s *hashSettings) error {
	if !s.HasHashSeed || s.HashSeed == "" {
		return usageError("--hash-seed is required: the pods' PYTHONHASHSEED (without it vLLM hashes are random per process)")
	}
	if s.BlockSize <= 0 {
		return usageError("--block-size is required and must be positive, got %d", s.BlockSize)
	}
	tokens, err := s.tokens()
	if err != nil {
		return err
	}
	h, err := kvindex.NewHasher(s.HashAlgo, s.HashSeed, s.BlockSize)
	if err != nil {
		return usageError("%v", err)
	}
	extras := kvindex.RequestExtras{LoRAName: s.LoRAName, CacheSalt: s.CacheSalt}
	digests, err := h.Digests(nil, tokens, extras)
	if err != nil {
		return fmt.Errorf("hash: %w", err)
	}
	if len(digests) == 0 {
		// Nothing on stdout is the right answer (vLLM hashes full blocks
		// only), but an empty output looks like a failure without a word.
		fmt.Fprintf(stderr, "prefixrouter: %d tokens do not fill one block of %d: no block hashes\n", len(tokens), s.BlockSize)
	}
	w := bufio.NewWriter(stdout)
	for _, d := range digests {
		if s.Format == "hex" {
			fmt.Fprintln(w, d.Hex())
		} else {
			fmt.Fprintln(w, d.Wire())
		}
	}
	return w.Flush()
}

func (s *hashSettings) tokens() ([]uint32, error) {
	switch {
	case s.HasTokens && s.TokensFile != "":
		return nil, usageError("give --tokens or --tokens-file, not both")
	case s.HasTokens:
		return parseTokenList(s.Tokens)
	case s.TokensFile != "":
		raw, err := os.ReadFile(s.TokensFile)
		if err != nil {
			return nil, usageError("--tokens-file: %v", err)
		}
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, usageError("--tokens-file %s: want a JSON array of token ids: %v", s.TokensFile, err)
		}
		out := make([]uint32, len(ids))
		for i, id := range ids {
			if id < 0 || id > 1<<32-1 {
				return nil, usageError("--tokens-file: token %d (%d) out of range", i, id)
			}
			out[i] = uint32(id)
		}
		return out, nil
	}
	return nil, usageError("give the tokens with --tokens 1,2,3 or --tokens-file F")
}

// hashSeedRandom is the --hash-seed value that means "PYTHONHASHSEED
// unset" in every command: sim models such pods, serve and hash refuse it.
// (vLLM itself would hash a PYTHONHASHSEED of "random" as that string.)
const hashSeedRandom = "random"

// refuseRandomSeed is the --hash-seed check of the commands that compute
// vLLM's hashes: pods without PYTHONHASHSEED root theirs at random bytes
// per process, which nobody outside can reproduce. remedy says what to do.
func refuseRandomSeed(remedy string) func(string) error {
	return func(v string) error {
		if v != hashSeedRandom {
			return nil
		}
		return fmt.Errorf("%q means pods without PYTHONHASHSEED, whose block hashes are random per process and cannot be recomputed: %s", v, remedy)
	}
}

func parseTokenList(s string) ([]uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uint32, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, usageError("--tokens: token %d (%q) is not a token id", i, strings.TrimSpace(p))
		}
		out[i] = uint32(v)
	}
	return out, nil
}
