package bench

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// rendered is what headless Chromium saw of a report.
type rendered struct {
	// Problems are console errors, uncaught exceptions and requests for
	// anything but the page itself.
	Problems []string
	Charts   []renderedChart
}

type renderedChart struct {
	ID            string
	Width, Height float64
	// Expect is the series the chart names (data-expect); Drawn those of
	// them with an element of non-zero size in its SVG.
	Expect, Drawn []string
}

// measureCharts runs in the page: each figure's SVG size and the series it
// draws with a visible element.
const measureCharts = `Array.from(document.querySelectorAll("figure.chart")).map(f => {
  const svg = f.querySelector("svg");
  const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  const expect = (f.dataset.expect || "").split(",").filter(s => s);
  const drawn = expect.filter(name => {
    const g = svg && svg.querySelector('[data-series="' + CSS.escape(name) + '"]');
    if (!g) return false;
    const b = g.getBBox();
    return b.width > 0 && b.height > 0;
  });
  return {ID: f.id, Width: r.width, Height: r.height, Expect: expect, Drawn: drawn};
})`

// renderInChromium opens a local page in headless Chromium (Debian's
// chromium, which scripts/ensure-deps.sh installs) and measures its charts.
func renderInChromium(t *testing.T, path string) rendered {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): `make test` installs it through scripts/ensure-deps.sh, as root; or apt-get install chromium", err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1600),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	var mu sync.Mutex
	var out rendered
	problem := func(format string, args ...any) {
		mu.Lock()
		out.Problems = append(out.Problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	url := "file://" + path
	err = chromedp.Listen(bctx, func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value))
				}
				problem("console.%s: %s", e.Type, strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			problem("exception: %s", e.ExceptionDetails.Text)
		case *cdplog.EventEntryAdded:
			if e.Entry.Level == cdplog.EntryLevelError {
				problem("log error: %s %s", e.Entry.Text, e.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			if e.Request.URL != url && !strings.HasPrefix(e.Request.URL, "data:") {
				problem("request: %s", e.Request.URL)
			}
		}
	})
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	// chromedp enables the runtime, log and network domains itself.
	if err := chromedp.Do(bctx, chromedp.Navigate(url), chromedp.WaitReady("body")); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	charts, err := chromedp.Run(bctx, chromedp.Evaluate[[]renderedChart](measureCharts))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	// Console events of the load arrive asynchronously: a last round trip
	// lets them in before the verdict.
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if !strings.HasPrefix(title, "prefixrouter bench") {
		problem("title %q", title)
	}
	mu.Lock()
	defer mu.Unlock()
	out.Charts = charts
	return out
}

// checkChartInChromium renders the report at path and checks that it has
// no problems and that the chart id drew exactly the series want.
func checkChartInChromium(t *testing.T, path, id string, want ...string) {
	t.Helper()
	got := renderInChromium(t, path)
	if len(got.Problems) > 0 {
		t.Fatalf("the page logged or requested:\n%s", strings.Join(got.Problems, "\n"))
	}
	for _, c := range got.Charts {
		if c.ID == id {
			if !slices.Equal(c.Drawn, want) || c.Width < 200 {
				t.Fatalf("%s chart %+v, want %v drawn", id, c, want)
			}
			return
		}
	}
	t.Fatalf("no %s chart among %+v", id, got.Charts)
}
