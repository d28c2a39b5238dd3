package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Report is what Inspect found in an image.
type Report struct {
	Digest            string
	User              string
	Entrypoint        []string
	Cmd               []string
	Layers            int
	CompressedBytes   int64 // what a registry stores and a node pulls
	UncompressedBytes int64 // the layers' tar streams
	BinaryBytes       int64
	Interpreter       string   // the ELF interpreter; empty for a static binary
	Needed            []string // the ELF's shared libraries; none for a static binary
	Shells            []string // shells found in the filesystem
	Version           string   // what the entrypoint printed for `version`
}

// shells are the paths where a shell would be.
var shells = []string{"/bin/sh", "/bin/bash", "/bin/ash", "/bin/dash", "/bin/busybox", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/busybox"}

// Load reads an image from a tarball written by Write, or from an OCI image
// layout directory holding one image.
func Load(p string) (v1.Image, error) {
	st, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", p, err)
	}
	if !st.IsDir() {
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, fmt.Errorf("image tarball %s: %w", p, err)
		}
		return img, nil
	}
	idx, err := layout.ImageIndexFromPath(p)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", p, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", p, err)
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("OCI layout %s: %d images, want 1", p, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", p, err)
	}
	return img, nil
}

// Inspect checks that img runs its entrypoint as a non-root user, without a
// shell or a dynamic loader: it extracts the layers into a temporary
// directory (no chroot, no engine) and runs the entrypoint with `version`
// and an empty environment. The report is filled as far as it got; the
// error lists every check that failed.
func Inspect(ctx context.Context, img v1.Image) (Report, error) {
	var r Report
	d, err := img.Digest()
	if err != nil {
		return r, fmt.Errorf("digest: %w", err)
	}
	r.Digest = d.String()
	cf, err := img.ConfigFile()
	if err != nil {
		return r, fmt.Errorf("config: %w", err)
	}
	r.User, r.Entrypoint, r.Cmd = cf.Config.User, cf.Config.Entrypoint, cf.Config.Cmd
	root, err := os.MkdirTemp("", "prefixrouter-image-")
	if err != nil {
		return r, fmt.Errorf("extract: %w", err)
	}
	defer os.RemoveAll(root)
	layers, err := img.Layers()
	if err != nil {
		return r, fmt.Errorf("layers: %w", err)
	}
	r.Layers = len(layers)
	for i, l := range layers {
		size, err := l.Size()
		if err != nil {
			return r, fmt.Errorf("layer %d: %w", i, err)
		}
		r.CompressedBytes += size
		n, err := extract(l, root)
		if err != nil {
			return r, fmt.Errorf("layer %d: %w", i, err)
		}
		r.UncompressedBytes += n
	}
	var problems []string
	if p := checkUser(r.User); p != "" {
		problems = append(problems, p)
	}
	for _, s := range shells {
		if _, err := os.Lstat(filepath.Join(root, s)); err == nil {
			r.Shells = append(r.Shells, s)
		}
	}
	if len(r.Shells) > 0 {
		problems = append(problems, "the image holds a shell: "+strings.Join(r.Shells, ", "))
	}
	if len(r.Entrypoint) == 0 || !path.IsAbs(r.Entrypoint[0]) {
		problems = append(problems, fmt.Sprintf("entrypoint %q is not an absolute path in exec form", r.Entrypoint))
		return r, errors.New(strings.Join(problems, "; "))
	}
	bin := filepath.Join(root, r.Entrypoint[0])
	st, err := os.Stat(bin)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		problems = append(problems, fmt.Sprintf("entrypoint %s is not an executable file in the image", r.Entrypoint[0]))
		return r, errors.New(strings.Join(problems, "; "))
	}
	r.BinaryBytes = st.Size()
	if err := readELF(bin, &r); err != nil {
		problems = append(problems, err.Error())
	}
	if r.Interpreter != "" || len(r.Needed) > 0 {
		problems = append(problems, fmt.Sprintf("entrypoint is dynamically linked (interpreter %q, needs %v): the image holds no loader or libraries", r.Interpreter, r.Needed))
	} else if out, err := runVersion(ctx, bin, root); err != nil {
		problems = append(problems, err.Error())
	} else {
		r.Version = out
	}
	if len(problems) > 0 {
		return r, errors.New(strings.Join(problems, "; "))
	}
	return r, nil
}

// checkUser says what is wrong with the config's user for a pod with
// runAsNonRoot: the kubelet verifies only a numeric UID other than 0.
func checkUser(u string) string {
	uid, _, _ := strings.Cut(u, ":")
	if uid == "" {
		return "no user: the container would run as root"
	}
	n, err := strconv.ParseUint(uid, 10, 32)
	if err != nil {
		return fmt.Sprintf("user %q is not a numeric UID: Kubernetes' runAsNonRoot cannot verify it", u)
	}
	if n == 0 {
		return fmt.Sprintf("user %q is root", u)
	}
	return ""
}

// extract writes a layer's directories and regular files under root and
// returns the tar stream's size. Links and devices are skipped.
func extract(l v1.Layer, root string) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	cr := &countingReader{r: rc}
	tr := tar.NewReader(cr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
		// Cleaned from the root, a name cannot climb out of it.
		name := path.Clean("/" + h.Name)
		dst := filepath.Join(root, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return 0, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return 0, err
			}
			f, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode).Perm())
			if err != nil {
				return 0, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return 0, fmt.Errorf("%s: %w", h.Name, err)
			}
		}
	}
	// The rest of the stream (tar padding) counts too.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, err
	}
	return cr.n, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// readELF records the binary's interpreter and needed libraries.
func readELF(bin string, r *Report) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("entrypoint is not an ELF executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return fmt.Errorf("ELF interpreter: %w", err)
			}
			r.Interpreter = strings.TrimRight(string(b), "\x00")
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return fmt.Errorf("ELF libraries: %w", err)
	}
	r.Needed = libs
	return nil
}

// runVersion runs `BIN version` from the extracted root with nothing in its
// environment, as a container with no shell and no inherited variables
// would.
func runVersion(ctx context.Context, bin, root string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "version")
	cmd.Env = []string{}
	cmd.Dir = root
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("entrypoint version: %w (stderr %q)", err, strings.TrimSpace(errb.String()))
	}
	v := strings.TrimSpace(out.String())
	if v == "" {
		return "", errors.New("entrypoint version printed nothing")
	}
	return v, nil
}
