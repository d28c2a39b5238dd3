package image

import (
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Write stores img under tag twice: as an OCI image layout in ociDir (for
// `skopeo copy oci:DIR docker://...` or `crane push DIR REF`), replacing
// what was there, and, when tarPath is not empty, as a tarball `docker
// load` and `podman load` read.
func Write(img v1.Image, tag, ociDir, tarPath string) error {
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	if err := os.RemoveAll(ociDir); err != nil {
		return fmt.Errorf("clear %s: %w", ociDir, err)
	}
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w", ociDir, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
	})); err != nil {
		return fmt.Errorf("OCI layout %s: %w", ociDir, err)
	}
	if tarPath == "" {
		return nil
	}
	if err := tarball.WriteToFile(tarPath, ref, img); err != nil {
		return fmt.Errorf("tarball %s: %w", tarPath, err)
	}
	return nil
}
