package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/kvindex"
)

func hashCommand() *cli.Command {
	return &cli.Command{
		Name:  "hash",
		Usage: "print vLLM prefix-cache block hashes for a token sequence",
		Description: "Computes the block hashes a vLLM pod publishes in its KV events for the given tokens,\n" +
			"one line per full block, as unsigned decimal (the event wire value) or, with --format hex,\n" +
			"the full digest. Compare them with `prefixrouter events` output to check that the router's\n" +
			"algorithm, seed and block size agree with the pods.",
		OnUsageError: onUsageError,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "algo", Value: "sha256", Usage: "hash algorithm: " + strings.Join(kvindex.HashAlgoNames(), ", ")},
			&cli.StringFlag{Name: "seed", Usage: "PYTHONHASHSEED of the vLLM pods (required)"},
			&cli.StringFlag{Name: "block-size", Usage: "tokens per KV-cache block (required)"},
			&cli.StringFlag{Name: "lora-name", Usage: "LoRA adapter name (extra key on every block)"},
			&cli.StringFlag{Name: "cache-salt", Usage: "request cache_salt (extra key on block 0)"},
			&cli.StringFlag{Name: "tokens", Usage: "comma-separated token ids"},
			&cli.StringFlag{Name: "tokens-file", Usage: "file holding a JSON array of token ids"},
			&cli.StringFlag{Name: "format", Value: "u64", Usage: "output: u64 (event wire value) or hex (full digest)"},
		},
		Action: runHash,
	}
}

func runHash(_ context.Context, cmd *cli.Command) error {
	algo, err := kvindex.ParseHashAlgo(cmd.String("algo"))
	if err != nil {
		return usageError("%v", err)
	}
	if !cmd.IsSet("seed") || cmd.String("seed") == "" {
		return usageError("--seed is required: the pods' PYTHONHASHSEED (without it vLLM hashes are random per process)")
	}
	if !cmd.IsSet("block-size") {
		return usageError("--block-size is required")
	}
	blockSize, err := strconv.Atoi(strings.TrimSpace(cmd.String("block-size")))
	if err != nil {
		return usageError("--block-size %q is not an integer", cmd.String("block-size"))
	}
	if blockSize <= 0 {
		return usageError("--block-size must be positive, got %d", blockSize)
	}
	format := cmd.String("format")
	if format != "u64" && format != "hex" {
		return usageError("--format %q (want u64 or hex)", format)
	}
	tokens, err := hashInputTokens(cmd)
	if err != nil {
		return err
	}
	h, err := kvindex.NewHasher(algo, cmd.String("seed"), blockSize)
	if err != nil {
		return usageError("%v", err)
	}
	extras := kvindex.RequestExtras{LoRAName: cmd.String("lora-name"), CacheSalt: cmd.String("cache-salt")}
	digests, err := h.Digests(nil, tokens, extras)
	if err != nil {
		return fmt.Errorf("hash: %w", err)
	}
	w := bufio.NewWriter(cmd.Root().Writer)
	for _, d := range digests {
		if format == "hex" {
			fmt.Fprintln(w, d.Hex())
		} else {
			fmt.Fprintln(w, d.Wire())
		}
	}
	return w.Flush()
}

func hashInputTokens(cmd *cli.Command) ([]uint32, error) {
	inline, file := cmd.IsSet("tokens"), cmd.IsSet("tokens-file")
	switch {
	case inline && file:
		return nil, usageError("give --tokens or --tokens-file, not both")
	case inline:
		return parseTokenList(cmd.String("tokens"))
	case file:
		raw, err := os.ReadFile(cmd.String("tokens-file"))
		if err != nil {
			return nil, usageError("--tokens-file: %v", err)
		}
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, usageError("--tokens-file %s: want a JSON array of token ids: %v", cmd.String("tokens-file"), err)
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
