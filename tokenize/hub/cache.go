package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RepoFolder is a model repository's directory in the cache, as
// huggingface_hub names it: models--ORG--NAME.
func RepoFolder(repo string) string {
	return "models--" + strings.ReplaceAll(repo, "/", "--")
}

// repoCache is one repository's directory in the hub cache.
type repoCache struct{ dir string }

func (c *Client) cache(repo string) repoCache {
	return repoCache{dir: filepath.Join(c.cfg.CacheDir, RepoFolder(repo))}
}

// commitOf is the commit a revision names: itself for a full hash, else
// what refs/REVISION recorded when it was last resolved.
func (rc repoCache) commitOf(rev string) (string, error) {
	if isCommit(rev) {
		return rev, nil
	}
	p := filepath.Join(rc.dir, "refs", filepath.FromSlash(rev))
	raw, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", ErrNotCached
	}
	if err != nil {
		return "", err
	}
	commit := strings.TrimSpace(string(raw))
	if !isCommit(commit) {
		return "", fmt.Errorf("%s holds %q, not a commit hash", p, commit)
	}
	return commit, nil
}

// lookup answers from the cache alone: the snapshot's file, or
// ErrEntryNotFound when .no_exist records that the commit has no such
// file, or ErrNotCached.
func (rc repoCache) lookup(rev, file string) (File, error) {
	commit, err := rc.commitOf(rev)
	if err != nil {
		return File{}, err
	}
	rel, err := relPath(file)
	if err != nil {
		return File{}, err
	}
	if _, err := os.Stat(filepath.Join(rc.dir, ".no_exist", commit, rel)); err == nil {
		return File{Commit: commit}, ErrEntryNotFound
	}
	if p := filepath.Join(rc.dir, "snapshots", commit, rel); regular(p) {
		return File{Path: p, Commit: commit}, nil
	}
	return File{Commit: commit}, ErrNotCached
}

func (rc repoCache) pointer(commit, file string) (string, error) {
	rel, err := relPath(file)
	if err != nil {
		return "", err
	}
	return filepath.Join(rc.dir, "snapshots", commit, rel), nil
}

// blob is where the content with this ETag lives; an ETag that is not a
// plain file name is refused rather than turned into a path.
func (rc repoCache) blob(etag string) (string, error) {
	if etag == "" || etag == "." || etag == ".." || strings.ContainsAny(etag, "/\\\x00") {
		return "", fmt.Errorf("ETag %q cannot name a cache file", etag)
	}
	return filepath.Join(rc.dir, "blobs", etag), nil
}

// writeRef records that rev resolved to commit (nothing for a commit).
func (rc repoCache) writeRef(rev, commit string) error {
	if rev == commit {
		return nil
	}
	p := filepath.Join(rc.dir, "refs", filepath.FromSlash(rev))
	if raw, err := os.ReadFile(p); err == nil && string(raw) == commit {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return writeAtomic(p, []byte(commit))
}

// markMissing records that commit has no such file (an empty file under
// .no_exist), so that offline use knows it is absent rather than uncached.
func (rc repoCache) markMissing(commit, file string) error {
	rel, err := relPath(file)
	if err != nil {
		return err
	}
	p := filepath.Join(rc.dir, ".no_exist", commit, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// link points the snapshot's file at its blob with a relative symlink,
// which survives moving the cache; it replaces any previous entry
// atomically.
func link(blob, pointer string) error {
	if err := os.MkdirAll(filepath.Dir(pointer), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(pointer), blob)
	if err != nil {
		return err
	}
	tmp := pointer + "." + strconv.FormatUint(rand.Uint64(), 36) + ".tmp"
	if err := os.Symlink(rel, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, pointer); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func writeAtomic(p string, data []byte) error {
	tmp := p + "." + strconv.FormatUint(rand.Uint64(), 36) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// relPath turns a repository file name into a relative path that cannot
// leave the snapshot.
func relPath(file string) (string, error) {
	for seg := range strings.SplitSeq(file, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "\\\x00") {
			return "", fmt.Errorf("file name %q: not a relative path inside the repository", file)
		}
	}
	return filepath.FromSlash(file), nil
}

// regular reports whether p (through a symlink) is a regular file.
func regular(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
