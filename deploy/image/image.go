// Package image assembles the prefixrouter container image without a
// container engine or a base image, and checks one: a single layer holding a
// static binary and the few files a non-root process on a read-only root
// filesystem needs, written as an OCI image layout and as a tarball that
// `docker load` and `podman load` read (github.com/google/go-containerregistry).
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's fixed layout. The user is distroless' "nonroot" (65532), so
// a pod's runAsNonRoot is satisfied by the image alone.
const (
	BinaryPath = "/usr/local/bin/prefixrouter"
	UID        = 65532
	CacheDir   = "/var/cache/prefixrouter" // HF_HOME's parent: an emptyDir or volume in Kubernetes
	APIPort    = "8000/tcp"
	AdminPort  = "9090/tcp"
)

// Config says what goes into the image.
type Config struct {
	Binary   string // the static prefixrouter binary to copy in
	CACerts  string // a PEM bundle for HTTPS (the Hugging Face Hub); empty: none
	Version  string // the image's version label
	Source   string // the org.opencontainers.image.source label; empty: none
	Arch     string // GOARCH of the binary
	Created  time.Time
	Revision string // org.opencontainers.image.revision; empty: none
}

// Build assembles the image: one layer, an OCI manifest, a config that runs
// the binary as UID 65532 with `serve` as its default command.
func Build(c Config) (v1.Image, error) {
	layer, err := buildLayer(c)
	if err != nil {
		return nil, err
	}
	created := v1.Time{Time: c.Created.UTC()}
	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   created,
			CreatedBy: "prefixrouter deploy/image: static binary, passwd, CA bundle",
			Comment:   "assembled without a base image",
		},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = c.Arch, "linux"
	cf.Created = created
	labels := map[string]string{
		"org.opencontainers.image.title":       "prefixrouter",
		"org.opencontainers.image.description": "OpenAI-compatible front door routing vLLM requests by prefix-cache hit",
		"org.opencontainers.image.version":     c.Version,
	}
	if c.Source != "" {
		labels["org.opencontainers.image.source"] = c.Source
	}
	if c.Revision != "" {
		labels["org.opencontainers.image.revision"] = c.Revision
	}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", UID, UID),
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"serve"},
		WorkingDir: "/",
		Env: []string{
			// The router listens on every interface inside the pod; the
			// admin listener's default is loopback, so the manifests set it.
			"HF_HOME=" + CacheDir + "/huggingface",
		},
		ExposedPorts: map[string]struct{}{APIPort: {}, AdminPort: {}},
		Labels:       labels,
		StopSignal:   "SIGTERM",
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	return img, nil
}

// file is one entry of the layer.
type file struct {
	name string
	mode int64
	uid  int
	body []byte
	dir  bool
}

// buildLayer writes the layer's tar: directories first, every entry with
// the build's time, so that the same inputs give the same digest.
func buildLayer(c Config) (v1.Layer, error) {
	bin, err := os.ReadFile(c.Binary)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID)
	files := []file{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/passwd", mode: 0o644, body: []byte(passwd)},
		{name: "etc/group", mode: 0o644, body: []byte(group)},
		// glibc's resolver (static in the binary) reads this for libzmq's
		// getaddrinfo: /etc/hosts first, then DNS.
		{name: "etc/nsswitch.conf", mode: 0o644, body: []byte("hosts: files dns\n")},
		{name: "home/", dir: true, mode: 0o755},
		{name: "home/nonroot/", dir: true, mode: 0o700, uid: UID},
		{name: "tmp/", dir: true, mode: 0o1777},
		{name: "usr/", dir: true, mode: 0o755},
		{name: "usr/local/", dir: true, mode: 0o755},
		{name: "usr/local/bin/", dir: true, mode: 0o755},
		{name: BinaryPath[1:], mode: 0o755, body: bin},
		{name: "var/", dir: true, mode: 0o755},
		{name: "var/cache/", dir: true, mode: 0o755},
		{name: CacheDir[1:] + "/", dir: true, mode: 0o755, uid: UID},
	}
	if c.CACerts != "" {
		pem, err := os.ReadFile(c.CACerts)
		if err != nil {
			return nil, fmt.Errorf("read CA bundle: %w", err)
		}
		files = append(files,
			file{name: "etc/ssl/", dir: true, mode: 0o755},
			file{name: "etc/ssl/certs/", dir: true, mode: 0o755},
			file{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: pem})
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := c.Created.UTC()
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	data := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return layer, nil
}
