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

// repoCache is one repository's directory in the hub cache. Every path
// under it is built by path, which checks each segment and that the result
// stays inside dir: the repository id, the revision, the commit and the ETag
// come from the user or from the hub's headers, and none of them may name a
// file elsewhere.
type repoCache struct{ dir string }

func (c *Client) cache(repo string) (repoCache, error) {
	if err := ValidRepoID(repo); err != nil {
		return repoCache{}, err
	}
	rc := repoCache{dir: filepath.Join(c.cfg.CacheDir, RepoFolder(repo))}
	if err := inside(c.cfg.CacheDir, rc.dir); err != nil {
		return repoCache{}, err
	}
	return rc, nil
}

// path joins area (refs, snapshots, …) and the slash-separated names under
// the repository's directory, each name's segments checked, and verifies
// that the result is still inside it.
func (rc repoCache) path(area string, names ...string) (string, error) {
	elems := []string{rc.dir, area}
	for _, n := range names {
		for seg := range strings.SplitSeq(n, "/") {
			if err := checkSegment(seg); err != nil {
				return "", fmt.Errorf("%q: %w", n, err)
			}
			elems = append(elems, seg)
		}
	}
	p := filepath.Join(elems...)
	if err := inside(rc.dir, p); err != nil {
		return "", err
	}
	return p, nil
}

func (rc repoCache) refPath(rev string) (string, error) {
	if err := validRevision(rev); err != nil {
		return "", err
	}
	return rc.path("refs", rev)
}

// commitPath is FILE under snapshots/COMMIT or .no_exist/COMMIT.
func (rc repoCache) commitPath(area, commit, file string) (string, error) {
	if !isCommit(commit) {
		return "", fmt.Errorf("commit %q: want 40 lowercase hex digits", commit)
	}
	if _, err := relPath(file); err != nil {
		return "", err
	}
	return rc.path(area, commit, file)
}

// commitOf is the commit a revision names: itself for a full hash, else
// what refs/REVISION recorded when it was last resolved.
func (rc repoCache) commitOf(rev string) (string, error) {
	if isCommit(rev) {
		return rev, nil
	}
	p, err := rc.refPath(rev)
	if err != nil {
		return "", err
	}
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
	missing, err := rc.commitPath(".no_exist", commit, file)
	if err != nil {
		return File{}, err
	}
	if _, err := os.Stat(missing); err == nil {
		return File{Commit: commit}, ErrEntryNotFound
	}
	p, err := rc.commitPath("snapshots", commit, file)
	if err != nil {
		return File{}, err
	}
	if regular(p) {
		return File{Path: p, Commit: commit}, nil
	}
	return File{Commit: commit}, ErrNotCached
}

func (rc repoCache) pointer(commit, file string) (string, error) {
	return rc.commitPath("snapshots", commit, file)
}

// blob is where the content with this ETag lives; an ETag that is not a
// plain file name is refused rather than turned into a path.
func (rc repoCache) blob(etag string) (string, error) {
	if err := checkSegment(etag); err != nil {
		return "", fmt.Errorf("ETag %q cannot name a cache file: %w", etag, err)
	}
	return rc.path("blobs", etag)
}

// writeRef records that rev resolved to commit (nothing for a commit).
func (rc repoCache) writeRef(rev, commit string) error {
	if rev == commit {
		return nil
	}
	p, err := rc.refPath(rev)
	if err != nil {
		return err
	}
	if !isCommit(commit) {
		return fmt.Errorf("commit %q: want 40 lowercase hex digits", commit)
	}
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
	p, err := rc.commitPath(".no_exist", commit, file)
	if err != nil {
		return err
	}
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
		if err := checkSegment(seg); err != nil {
			return "", fmt.Errorf("file name %q: not a relative path inside the repository: %w", file, err)
		}
	}
	return filepath.FromSlash(file), nil
}

// maxSegment is the longest file name the common file systems take.
const maxSegment = 255

// checkSegment refuses what cannot be one plain file name: empty, "." or
// "..", a separator, a NUL or a control character, longer than maxSegment.
func checkSegment(seg string) error {
	switch {
	case seg == "":
		return errors.New("an empty path segment")
	case seg == "." || seg == "..":
		return fmt.Errorf("the path segment %q", seg)
	case len(seg) > maxSegment:
		return fmt.Errorf("a path segment longer than %d bytes", maxSegment)
	}
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; c == '/' || c == '\\' || c < 0x20 || c == 0x7f {
			return fmt.Errorf("character %q in a path segment", c)
		}
	}
	return nil
}

// inside verifies that p, once cleaned, is root or below it: the last check
// before a path built from names reaches the file system.
func inside(root, p string) error {
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(p))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return fmt.Errorf("%s is not inside the hub cache %s", p, root)
	}
	return nil
}

// regular reports whether p (through a symlink) is a regular file.
func regular(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
