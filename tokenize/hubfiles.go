package tokenize

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/prefixrouter/prefixrouter/tokenize/hub"
)

// The files loadLocal reads from a model directory: tokenizer.json is
// required, the others are read when the repository has them.
const hubTokenizerFile = "tokenizer.json"

var hubOptionalFiles = []string{"tokenizer_config.json", "chat_template.jinja"}

// unreadableTokenizers are files that mean a tokenizer the local loader
// cannot read, so that a repository without tokenizer.json is told what it
// has instead.
var unreadableTokenizers = []struct{ file, what string }{
	{"tokenizer.model", "a SentencePiece model (tokenizer.model)"},
	{"tekken.json", "a Mistral tekken tokenizer (tekken.json)"},
	{"vocab.json", "a slow tokenizer (vocab.json, merges.txt)"},
}

// fetchTokenizer brings ref's tokenizer files into the hub cache and
// returns the snapshot directory that holds them. Every file comes from
// the commit tokenizer.json resolved to, so a branch that moves meanwhile
// cannot mix two versions.
func fetchTokenizer(ctx context.Context, c *hub.Client, name string, ref hub.Ref, log *slog.Logger) (string, error) {
	f, err := c.Download(ctx, ref, hubTokenizerFile)
	if errors.Is(err, hub.ErrEntryNotFound) {
		return "", noTokenizerJSON(ctx, c, name, ref, f.Commit)
	}
	if err != nil {
		return "", err
	}
	at := hub.Ref{Repo: ref.Repo, Revision: f.Commit}
	for _, name := range hubOptionalFiles {
		_, err := c.Download(ctx, at, name)
		switch {
		case err == nil, errors.Is(err, hub.ErrEntryNotFound):
		case errors.Is(err, hub.ErrNotCached):
			// A cache filled by a download of selected files leaves no
			// record of those it skipped: taken as absent, as transformers
			// does offline.
			log.Info("tokenizer file not in the hub cache; loading without it", "repo", ref.Repo, "commit", f.Commit, "file", name)
		default:
			return "", err
		}
	}
	return filepath.Dir(f.Path), nil
}

// noTokenizerJSON says that ref has no tokenizer.json, what it has instead
// when that is a tokenizer the router cannot read, and how model name can
// still be served.
func noTokenizerJSON(ctx context.Context, c *hub.Client, name string, ref hub.Ref, commit string) error {
	at := ref
	if commit != "" {
		at.Revision = commit
	}
	var has []string
	for _, u := range unreadableTokenizers {
		// Best effort: a failed check only shortens the message.
		if ok, _ := c.Exists(ctx, at, u.file); ok {
			has = append(has, u.what)
		}
	}
	msg := ref.String() + " has no tokenizer.json"
	if len(has) > 0 {
		msg += ", only " + strings.Join(has, " and ") + ", which the router cannot read"
	}
	return fmt.Errorf("%s; let the pods tokenize it with --tokenizer %s:remote= or --tokenization remote", msg, name)
}
