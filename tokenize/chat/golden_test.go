package chat

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const chatData = "../../testdata/chat"

// caseVars builds the variables the reference renderer passed: messages,
// tools (None when absent), documents=None, add_generation_prompt (False when
// absent), the other case keys, then the special-token variables.
func caseVars(t *testing.T, raw json.RawMessage, special json.RawMessage) *Vars {
	t.Helper()
	cv, err := FromJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	c := cv.(*Dict)
	vars := NewDict()
	m, _ := c.Get("messages")
	vars.Set("messages", m)
	tools, ok := c.Get("tools")
	if !ok {
		tools = nil
	}
	vars.Set("tools", tools)
	vars.Set("documents", nil)
	agp, ok := c.Get("add_generation_prompt")
	if !ok {
		agp = false
	}
	vars.Set("add_generation_prompt", agp)
	for _, k := range c.Keys() {
		if k == "messages" || k == "tools" || k == "add_generation_prompt" {
			continue
		}
		v, _ := c.Get(k)
		vars.Set(k, v)
	}
	sv, err := FromJSON(special)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range sv.(*Dict).Keys() {
		v, _ := sv.(*Dict).Get(k)
		vars.Set(k, v)
	}
	return vars
}

func TestGoldenRenders(t *testing.T) {
	casesRaw, err := os.ReadFile(filepath.Join(chatData, "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases map[string]json.RawMessage
	if err := json.Unmarshal(casesRaw, &cases); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	slices.Sort(names)
	// Every template under templates/ has references: the real models'
	// and the small ones that exercise Python semantics directly.
	paths, err := filepath.Glob(filepath.Join(chatData, "templates", "*.jinja"))
	if err != nil || len(paths) < 4 {
		t.Fatalf("templates: %v (found %d)", err, len(paths))
	}
	for _, path := range paths {
		model := strings.TrimSuffix(filepath.Base(path), ".jinja")
		t.Run(model, func(t *testing.T) {
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			special, err := os.ReadFile(filepath.Join(chatData, "templates", model+".special.json"))
			if err != nil {
				t.Fatal(err)
			}
			refRaw, err := os.ReadFile(filepath.Join(chatData, "ref", model+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref map[string]struct {
				OK  *string `json:"ok"`
				Err *string `json:"err"`
			}
			if err := json.Unmarshal(refRaw, &ref); err != nil {
				t.Fatal(err)
			}
			tmpl, err := Compile(string(src))
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			for _, name := range names {
				t.Run(name, func(t *testing.T) {
					want, ok := ref[name]
					if !ok {
						t.Fatalf("no reference for %s", name)
					}
					got, err := tmpl.Render(caseVars(t, cases[name], special))
					switch {
					case want.Err != nil && err == nil:
						t.Fatalf("rendered %q, want error %s", got, *want.Err)
					case want.Err != nil:
						t.Logf("error as expected: %v (Python: %s)", err, *want.Err)
					case err != nil:
						t.Fatalf("error %v, want render", err)
					case got != *want.OK:
						t.Fatalf("render differs%s", firstDiff(got, *want.OK))
					}
				})
			}
		})
	}
}

// firstDiff shows the first line where got and want differ, with its
// number: the references are long.
func firstDiff(got, want string) string {
	g, w := strings.SplitAfter(got, "\n"), strings.SplitAfter(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf(" at line %d:\n got %q\nwant %q", i+1, gl, wl)
		}
	}
	return ""
}
