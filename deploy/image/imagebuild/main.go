// Command imagebuild assembles the prefixrouter container image from a
// static binary (`make image` builds one with scripts/build-static.sh),
// writes it as an OCI image layout and a loadable tarball, then checks it
// with image.Inspect and prints what it found.
package main

import (
	"context"
	"debug/elf"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prefixrouter/prefixrouter/deploy/image"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run() error {
	var c image.Config
	var tag, ociDir, tarPath string
	flag.StringVar(&c.Binary, "binary", "bin/prefixrouter-static", "the static prefixrouter binary")
	flag.StringVar(&c.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "PEM bundle copied to /etc/ssl/certs (empty: none)")
	flag.StringVar(&c.Version, "version", "dev", "image version label")
	flag.StringVar(&c.Revision, "revision", "", "source revision label")
	flag.StringVar(&c.Source, "source", "", "source repository label")
	flag.StringVar(&tag, "tag", "prefixrouter:dev", "image reference recorded in the layout and the tarball")
	flag.StringVar(&ociDir, "oci", "bin/image/oci", "OCI image layout directory (replaced)")
	flag.StringVar(&tarPath, "tar", "bin/image/prefixrouter.tar", "docker/podman load tarball (empty: none)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", flag.Arg(0))
	}
	arch, err := goarch(c.Binary)
	if err != nil {
		return err
	}
	c.Arch = arch
	// SOURCE_DATE_EPOCH makes the image reproducible; otherwise now.
	c.Created = time.Now()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		c.Created = time.Unix(sec, 0)
	}
	img, err := image.Build(c)
	if err != nil {
		return err
	}
	for _, d := range []string{filepath.Dir(ociDir), filepath.Dir(tarPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := image.Write(img, tag, ociDir, tarPath); err != nil {
		return err
	}
	r, err := image.Inspect(context.Background(), img)
	if err != nil {
		return fmt.Errorf("image check: %w", err)
	}
	fmt.Printf("image %s (%s)\n  oci layout: %s\n  tarball:    %s\n", tag, r.Digest, ociDir, tarPath)
	fmt.Printf("  user %s, entrypoint %v, cmd %v, %d layer\n", r.User, r.Entrypoint, r.Cmd, r.Layers)
	fmt.Printf("  size: %.1f MB compressed, %.1f MB uncompressed (binary %.1f MB)\n",
		float64(r.CompressedBytes)/1e6, float64(r.UncompressedBytes)/1e6, float64(r.BinaryBytes)/1e6)
	fmt.Printf("  static: no ELF interpreter, no shared libraries; no shell; `version` with an empty environment: %s\n", r.Version)
	return nil
}

// goarch maps the binary's ELF machine to the image's architecture.
func goarch(bin string) (string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return "", fmt.Errorf("binary %s: %w", bin, err)
	}
	defer f.Close()
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("binary %s: unsupported machine %v", bin, f.Machine)
}
