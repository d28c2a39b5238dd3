package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/prefixrouter/prefixrouter/router"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md's flag references from the commands")

// parseServe parses args (and the environment) with the serve command's
// flag table and returns what it set, without running anything.
func parseServe(t *testing.T, args ...string) serveSettings {
	t.Helper()
	s := defaultServeSettings()
	ft := newFlagTable("serve")
	cmd := ft.command(&cli.Command{Name: "serve", Flags: s.flags(ft), Action: func(context.Context, *cli.Command) error { return nil }})
	if err := cmd.Run(context.Background(), append([]string{"serve"}, args...)); err != nil {
		t.Fatalf("serve %q: %v", args, err)
	}
	return s
}

func TestServeFlagDefaultsAreTheConfigDefaults(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PREFIXROUTER_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
	s := parseServe(t)
	if got := s.config(); !reflect.DeepEqual(got, router.DefaultConfig()) {
		t.Fatalf("serve without flags gives\n%+v\nwant router.DefaultConfig()\n%+v", got, router.DefaultConfig())
	}
}

// notSetByFlags are the config fields no flag sets: the router copies them
// from --block-size and --hash-algo.
var notSetByFlags = map[string]bool{"Health.BlockSize": true, "Health.HashAlgo": true}

// otherValue is a value for the flag that differs from its default and
// that the flag accepts.
func otherValue(t *testing.T, f cli.Flag) string {
	switch f := f.(type) {
	case *cli.StringFlag:
		switch f.Name {
		case "policy":
			return "least-load"
		case "tokenization":
			return "remote"
		case "log-level":
			return "debug"
		case "log-format":
			return "json"
		case "hash-algo":
			return "xxhash"
		case "speculative-ttl":
			return "1.5s"
		}
		return f.Value + "x"
	case *cli.StringSliceFlag:
		return "a"
	case *cli.DurationFlag:
		return (f.Value + time.Second).String()
	case *cli.IntFlag:
		return strconv.Itoa(f.Value + 1)
	case *cli.Int64Flag:
		return strconv.FormatInt(f.Value+1, 10)
	case *cli.FloatFlag:
		switch f.Name {
		case "speculative-ttl-percentile":
			return "0.95"
		case "holdback":
			return "0.1"
		}
		return strconv.FormatFloat(f.Value+0.5, 'g', -1, 64)
	case *cli.BoolFlag:
		return strconv.FormatBool(!f.Value)
	}
	t.Fatalf("flag %s: no other value for %T", f.Names()[0], f)
	return ""
}

// TestServeFlagsSetEveryConfigField gives every flag a value other than its
// default, once on the command line and once through its environment
// variable, and checks that every config field moved: a field without a
// flag, or a flag or variable bound to nothing, fails.
func TestServeFlagsSetEveryConfigField(t *testing.T) {
	def := defaultServeSettings()
	var args []string
	env := map[string]string{}
	for _, f := range def.flags(newFlagTable("serve")) {
		name, v := f.Names()[0], otherValue(t, f)
		args = append(args, "--"+name+"="+v)
		env["PREFIXROUTER_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))] = v
	}
	t.Run("flags", func(t *testing.T) {
		checkEveryFieldMoved(t, parseServe(t, args...), def)
	})
	t.Run("environment", func(t *testing.T) {
		for k, v := range env {
			t.Setenv(k, v)
		}
		checkEveryFieldMoved(t, parseServe(t), def)
	})
}

func checkEveryFieldMoved(t *testing.T, got, def serveSettings) {
	t.Helper()
	var walk func(path string, g, d reflect.Value)
	walk = func(path string, g, d reflect.Value) {
		if g.Kind() == reflect.Struct {
			for i := range g.NumField() {
				name := g.Type().Field(i).Name
				if path != "" && path != "Config" {
					name = path + "." + name
				}
				walk(name, g.Field(i), d.Field(i))
			}
			return
		}
		if reflect.DeepEqual(g.Interface(), d.Interface()) != notSetByFlags[path] {
			if notSetByFlags[path] {
				t.Errorf("%s was set by a flag; it is listed as set by none", path)
			} else {
				t.Errorf("%s kept its default %v: no flag sets it", path, d.Interface())
			}
		}
	}
	walk("", reflect.ValueOf(got), reflect.ValueOf(def))
}

// TestConfigurationDoc: docs/configuration.md's flag references are the
// commands', names, variables and defaults included. Rewrite them with
// `go test ./cmd/prefixrouter -run TestConfigurationDoc -update`.
func TestConfigurationDoc(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "configuration.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, cmd := range newApp(nil, io.Discard, io.Discard).Commands {
		if len(cmd.Flags) == 0 {
			continue
		}
		begin, end := "<!-- "+cmd.Name+" flags: begin -->\n", "<!-- "+cmd.Name+" flags: end -->\n"
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		if i < 0 || j < i {
			t.Errorf("%s lacks the markers %q and %q", path, begin, end)
			continue
		}
		level := "####"
		if cmd.Name == "serve" {
			level = "###"
		}
		want := flagReference(cmd, level)
		have := doc[i+len(begin) : j]
		if have == want {
			continue
		}
		if *update {
			doc = doc[:i+len(begin)] + want + doc[j:]
			continue
		}
		hl, wl := strings.Split(have, "\n"), strings.Split(want, "\n")
		for k := range max(len(hl), len(wl)) {
			var h, w string
			if k < len(hl) {
				h = hl[k]
			}
			if k < len(wl) {
				w = wl[k]
			}
			if h != w {
				t.Errorf("%s disagrees with `prefixrouter %s` at line %d of its flag reference:\n doc: %s\n cli: %s\n(rewrite it: go test ./cmd/prefixrouter -run TestConfigurationDoc -update)", path, cmd.Name, k+1, h, w)
				break
			}
		}
	}
	if *update && doc != string(raw) {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// flagReference renders a command's flags as markdown tables, one per
// category in the order the categories first appear, each under a heading
// of the given level (a command without categories has one table).
func flagReference(cmd *cli.Command, level string) string {
	var order []string
	byCat := map[string][]cli.Flag{}
	for _, f := range cmd.Flags {
		c := f.(cli.CategorizableFlag).GetCategory()
		if _, ok := byCat[c]; !ok {
			order = append(order, c)
		}
		byCat[c] = append(byCat[c], f)
	}
	var b strings.Builder
	for _, c := range order {
		if c != "" {
			fmt.Fprintf(&b, "\n%s %s\n", level, c)
		}
		b.WriteString("\n| Flag | Environment variable | Default | Meaning |\n|---|---|---|---|\n")
		for _, f := range byCat[c] {
			df := f.(cli.DocGenerationFlag)
			kind := df.TypeName()
			if m, ok := f.(cli.DocGenerationMultiValueFlag); ok && m.IsMultiValueFlag() {
				kind += ", repeatable"
			}
			fmt.Fprintf(&b, "| `--%s` %s | `%s` | %s | %s |\n", f.Names()[0], kind,
				strings.Join(df.GetEnvVars(), "`, `"), docDefault(df), strings.ReplaceAll(df.GetUsage(), "|", `\|`))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// docDefault is the default as help prints it: the flag's default text if
// it has one, else its value.
func docDefault(df cli.DocGenerationFlag) string {
	if s := df.GetDefaultText(); s != "" {
		return s
	}
	v := df.GetValue()
	if u, err := strconv.Unquote(v); err == nil {
		v = u
	}
	switch {
	case v == "" && !df.TakesValue():
		return "`false`"
	case v == "":
		return "none"
	}
	return "`" + v + "`"
}
