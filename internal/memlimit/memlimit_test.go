package memlimit

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestContainer(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  int64
		bad   bool
	}{
		{"v2 limit", map[string]string{"memory.max": "1073741824\n"}, 1 << 30, false},
		{"v2 unlimited", map[string]string{"memory.max": "max\n"}, 0, false},
		{"v1 limit", map[string]string{"memory/memory.limit_in_bytes": "536870912\n"}, 512 << 20, false},
		{"v1 unlimited", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0, false},
		{"v2 wins over v1", map[string]string{"memory.max": "1048576", "memory/memory.limit_in_bytes": "2097152"}, 1 << 20, false},
		{"none", map[string]string{}, 0, false},
		{"garbage", map[string]string{"memory.max": "lots"}, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for name, body := range c.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := Container(root)
			if (err != nil) != c.bad {
				t.Fatalf("err = %v, want error %v", err, c.bad)
			}
			if got != c.want {
				t.Fatalf("limit = %d, want %d", got, c.want)
			}
		})
	}
}

func TestApplyFromCgroup(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	before := Current()
	t.Cleanup(func() {
		if before == 0 {
			setNoLimit()
		} else {
			setLimit(before)
		}
	})
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "memory.max"), []byte("1073741824"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Apply(root)
	if err != nil {
		t.Fatal(err)
	}
	share := RuntimeShare
	want := int64(float64(1<<30) * share)
	if d.Source != "cgroup" || d.Limit != want || d.Container != 1<<30 {
		t.Fatalf("decision = %+v, want cgroup %d", d, want)
	}
	if Current() != want {
		t.Fatalf("runtime limit = %d, want %d", Current(), want)
	}
}

func TestHeapCounts(t *testing.T) {
	if NewHeap().Bytes() <= 0 {
		t.Fatal("the runtime counts no memory")
	}
}

func setNoLimit()      { debug.SetMemoryLimit(math.MaxInt64) }
func setLimit(l int64) { debug.SetMemoryLimit(l) }
