package deploy

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// pinned is an image reference with a tag and the digest of its index.
var pinned = regexp.MustCompile(`^([a-z0-9./-]+):([A-Za-z0-9._-]+)@sha256:[0-9a-f]{64}$`)

// TestDockerfileBaseImagesPinned: every FROM of deploy/Dockerfile names its
// base image by digest (a tag alone moves with every rebuild), after the
// defaults of the ARGs it uses, and the build and runtime stages are on
// one Debian release (the binary links the build stage's libzmq and runs
// with the runtime's).
func TestDockerfileBaseImagesPinned(t *testing.T) {
	f, err := os.Open("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := map[string]string{}
	stages := map[string]bool{}
	var tags []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "ARG":
			name, value, _ := strings.Cut(fields[1], "=")
			args[name] = value
		case "FROM":
			image := fields[1]
			if strings.HasPrefix(image, "--platform") && len(fields) > 2 {
				image = fields[2]
			}
			for name, value := range args {
				image = strings.ReplaceAll(image, "${"+name+"}", value)
				image = strings.ReplaceAll(image, "$"+name, value)
			}
			if len(fields) >= 4 && strings.EqualFold(fields[len(fields)-2], "AS") {
				stages[fields[len(fields)-1]] = true
			}
			if stages[image] && !strings.Contains(image, ":") {
				continue // an earlier stage
			}
			m := pinned.FindStringSubmatch(image)
			if m == nil {
				t.Errorf("Dockerfile:%d: FROM %s: want NAME:TAG@sha256:DIGEST (the index digest of the tag; the update procedure is in the Dockerfile)", n, image)
				continue
			}
			tags = append(tags, m[2])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(tags) != 2 {
		t.Fatalf("%d base images, want 2 (build and runtime)", len(tags))
	}
	release := func(tag string) string {
		for _, r := range []string{"bookworm", "trixie", "bullseye"} {
			if strings.Contains(tag, r) {
				return r
			}
		}
		return tag
	}
	if a, b := release(tags[0]), release(tags[1]); a != b {
		t.Errorf("the build stage is on %s, the runtime on %s: the binary's libzmq must come from one release", a, b)
	}
}
