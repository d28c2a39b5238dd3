package image

import (
	"archive/tar"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// -image checks a built image (`make image` passes bin/image/prefixrouter.tar)
// instead of a tiny one the test assembles itself.
var imagePath = flag.String("image", "", "image tarball or OCI layout to check instead of a test image")

// tiny is the path of the static test program, built once per run.
var tiny struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if tiny.dir != "" {
		os.RemoveAll(tiny.dir)
	}
	os.Exit(code)
}

// tinyBinary builds a static Go program that answers `version` as
// prefixrouter does, and only when its environment is empty.
func tinyBinary(t *testing.T) string {
	t.Helper()
	tiny.once.Do(func() { tiny.dir, tiny.bin, tiny.err = buildTiny() })
	if tiny.err != nil {
		t.Fatal(tiny.err)
	}
	return tiny.bin
}

func buildTiny() (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", "prefixrouter-tiny-")
	if err != nil {
		return "", "", err
	}
	src := `package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] != "version" || len(os.Environ()) != 0 {
		os.Exit(3)
	}
	fmt.Println("tiny-1")
}
`
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		return dir, "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module tiny\n\ngo 1.26\n"), 0o644); err != nil {
		return dir, "", err
	}
	bin = filepath.Join(dir, "tiny")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return dir, bin, nil
}

func testConfig(bin string) Config {
	return Config{Binary: bin, Version: "test", Arch: "amd64", Created: time.Unix(1_700_000_000, 0)}
}

// TestImage checks the image: a numeric non-root user, the binary as
// entrypoint with serve as the default command, no shell, a static binary
// that prints its version from the extracted layer with an empty
// environment; both written forms read back to the same image.
func TestImage(t *testing.T) {
	ctx := context.Background()
	var img v1.Image
	if *imagePath != "" {
		var err error
		if img, err = Load(*imagePath); err != nil {
			t.Fatal(err)
		}
	} else {
		built, err := Build(testConfig(tinyBinary(t)))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		oci, tarPath := filepath.Join(dir, "oci"), filepath.Join(dir, "image.tar")
		if err := Write(built, "prefixrouter:test", oci, tarPath); err != nil {
			t.Fatal(err)
		}
		// The layout keeps the manifest as built; a load tarball keeps the
		// config and the layers (its manifest is docker's, rebuilt on load).
		for _, c := range []struct {
			path string
			id   func(v1.Image) (v1.Hash, error)
		}{{oci, v1.Image.Digest}, {tarPath, v1.Image.ConfigName}} {
			back, err := Load(c.path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.id(back)
			if err != nil {
				t.Fatal(err)
			}
			if want, _ := c.id(built); got != want {
				t.Fatalf("%s: %s, built %s", c.path, got, want)
			}
		}
		img, err = Load(tarPath)
		if err != nil {
			t.Fatal(err)
		}
	}
	r, err := Inspect(ctx, img)
	if err != nil {
		t.Fatalf("image check: %v", err)
	}
	if r.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", r.User)
	}
	if len(r.Entrypoint) != 1 || r.Entrypoint[0] != BinaryPath {
		t.Errorf("entrypoint %q, want [%s]", r.Entrypoint, BinaryPath)
	}
	if len(r.Cmd) != 1 || r.Cmd[0] != "serve" {
		t.Errorf("cmd %q, want [serve]", r.Cmd)
	}
	if *imagePath == "" && r.Version != "tiny-1" {
		t.Errorf("version %q, want tiny-1", r.Version)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{APIPort, AdminPort} {
		if _, ok := cf.Config.ExposedPorts[p]; !ok {
			t.Errorf("port %s not exposed", p)
		}
	}
	t.Logf("image %s: user %s, entrypoint %v, version %q; %d bytes compressed, %d uncompressed, binary %d",
		r.Digest, r.User, r.Entrypoint, r.Version, r.CompressedBytes, r.UncompressedBytes, r.BinaryBytes)
}

// TestBuildIsReproducible: the same inputs and time give the same digest.
func TestBuildIsReproducible(t *testing.T) {
	bin := tinyBinary(t)
	var digests []v1.Hash
	for range 2 {
		img, err := Build(testConfig(bin))
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Fatalf("digests differ: %v", digests)
	}
}

// TestInspectRefuses: each way an image can break the promise is named.
func TestInspectRefuses(t *testing.T) {
	static := tinyBinary(t)
	dynamic, err := exec.LookPath("true") // Debian's coreutils: dynamically linked
	if err != nil {
		t.Fatal(err)
	}
	withUser := func(u string) func(v1.Image) v1.Image {
		return func(img v1.Image) v1.Image {
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			cf = cf.DeepCopy()
			cf.Config.User = u
			out, err := mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
	for _, tc := range []struct {
		name   string
		binary string
		change func(v1.Image) v1.Image
		want   string
	}{
		{"root user", static, withUser("0:0"), `user "0:0" is root`},
		{"no user", static, withUser(""), "no user"},
		{"named user", static, withUser("nonroot"), "not a numeric UID"},
		{"dynamic binary", dynamic, nil, "dynamically linked"},
		{"a shell", static, func(img v1.Image) v1.Image {
			return appendFile(t, img, "bin/sh", []byte("#!"))
		}, "holds a shell: /bin/sh"},
		{"entrypoint missing", static, func(img v1.Image) v1.Image {
			cf, _ := img.ConfigFile()
			cf = cf.DeepCopy()
			cf.Config.Entrypoint = []string{"/usr/bin/prefixrouter"}
			out, err := mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}, "not an executable file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := Build(testConfig(tc.binary))
			if err != nil {
				t.Fatal(err)
			}
			if tc.change != nil {
				img = tc.change(img)
			}
			_, err = Inspect(context.Background(), img)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Inspect: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// appendFile adds a layer holding one file.
func appendFile(t *testing.T, img v1.Image, name string, body []byte) v1.Image {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	out, err := mutate.AppendLayers(img, l)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
