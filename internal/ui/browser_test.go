package ui_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/server"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/traffic"
)

const (
	model      = "sim-model"
	adminToken = "ui-test-token"
	// waitFor bounds waits for asynchronous states (the first scrapes, a
	// drain): generous deadlines, not timing assertions.
	waitFor = 30 * time.Second
	// ejectionShownWithin is docs/UI.md's bar: the page reflects an ejection
	// within 2 s of the admin API reporting it.
	ejectionShownWithin = 2 * time.Second
)

// chromium returns the browser's path. It skips the test when there is none,
// except in CI (CI=true), where .ci/run installs it and its absence fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (CI=true): .ci/run must install it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed (apt-get install chromium); this test drives /ui in it")
	return ""
}

// screenshotDir is where the screenshots go: $LLMLB_UI_SCREENSHOTS (docs/img
// when refreshing the docs) or the test's artifact directory.
func screenshotDir(t *testing.T) string {
	if dir := os.Getenv("LLMLB_UI_SCREENSHOTS"); dir != "" {
		return dir
	}
	return t.ArtifactDir()
}

// fleetWithBalancer starts 4 simulated replicas, llmlb in front of them and
// agent-like traffic; it returns the admin URL.
func fleetWithBalancer(t *testing.T) (fleet *simreplica.Fleet, admin string) {
	t.Helper()
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: 4, Model: model, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	cfg := config.Default()
	cfg.AdminToken = adminToken
	cfg.Scrape.Interval, cfg.Scrape.Timeout = 300*time.Millisecond, 3*time.Second
	// A long cooldown keeps the ejected replica EJECTED while the page is
	// looked at (and a slow scrape on a busy machine would only cost that
	// replica, not the test: the checks name sim-4 and sim-1 only).
	cfg.Routing.Health.BaseCooldown = 2 * time.Minute
	for _, r := range fleet.Replicas {
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: r.Name(), URL: r.URL(), Models: []string{model}})
	}
	srv, err := server.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.UseListeners(proxyLn, adminLn)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	gen := traffic.New(traffic.Options{
		BaseURL: "http://" + proxyLn.Addr().String(), Model: model, Users: 6, Projects: 2,
		BurstMin: 1, BurstMax: 3, Turns: 6, Think: 300 * time.Millisecond, MaxTokens: 16,
		SystemPromptChars: 2000, Seed: 1,
	})
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	trafficDone := make(chan struct{})
	go func() { gen.Run(trafficCtx); close(trafficDone) }()
	t.Cleanup(func() {
		stopTraffic()
		<-trafficDone
		stop()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return fleet, "http://" + adminLn.Addr().String()
}

// replicas reads GET /admin/replicas.
func replicas(t *testing.T, admin string) map[string]balancer.ReplicaStatus {
	t.Helper()
	resp, err := http.Get(admin + "/admin/replicas")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []balancer.ReplicaStatus
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	out := map[string]balancer.ReplicaStatus{}
	for _, r := range list {
		out[r.Name] = r
	}
	return out
}

// waitAdmin polls the admin API until ok holds and returns when it did.
func waitAdmin(t *testing.T, admin, what string, ok func(map[string]balancer.ReplicaStatus) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		if ok(replicas(t, admin)) {
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the admin API never reported %s", what)
	return time.Time{}
}

// pageText evaluates a JavaScript string expression in the page.
func pageText(t *testing.T, ctx context.Context, expr string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return s
}

// waitPage polls a JavaScript predicate in the page.
func waitPage(t *testing.T, ctx context.Context, what, predicate string, timeout time.Duration) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		t.Fatalf("the page never showed %s: %v\nreplica rows: %s", what, err,
			pageText(t, ctx, `[...document.querySelectorAll('#replicas tbody tr')].map(r => r.innerText.replace(/\s+/g, ' ')).join('\n')`))
	}
}

// screenshot saves the viewport at width x height as a PNG.
func screenshot(t *testing.T, ctx context.Context, name string, width, height int64) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the layout settle at the new width (a picture, not an assertion)
	began := time.Now()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("captured %s in %v", name, time.Since(began).Round(time.Millisecond))
	// Refreshing docs/img: reduced to 256 colours (the page has few), so
	// that the committed PNGs stay small.
	if os.Getenv("LLMLB_UI_SCREENSHOTS") != "" {
		img, err := png.Decode(bytes.NewReader(buf))
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&out, paletted(img)); err != nil {
			t.Fatal(err)
		}
		buf = out.Bytes()
	}
	path := filepath.Join(screenshotDir(t), name)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d KiB)", path, len(buf)/1024)
}

// paletted maps img onto its 256 most frequent colours (nearest by RGB
// distance): the dashboard's flat colours survive, anti-aliased edges snap
// to a close one.
func paletted(img image.Image) *image.Paletted {
	bounds := img.Bounds()
	count := map[color.RGBA]int{}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			count[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(count))
	for c := range count {
		colors = append(colors, c)
	}
	slices.SortFunc(colors, func(a, b color.RGBA) int {
		return cmp.Or(count[b]-count[a], cmp.Compare(uint32(a.R)<<16|uint32(a.G)<<8|uint32(a.B), uint32(b.R)<<16|uint32(b.G)<<8|uint32(b.B)))
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(256, len(colors))] {
		pal = append(pal, c)
	}
	index := make(map[color.RGBA]uint8, len(colors))
	for _, c := range colors {
		best, bestD := 0, math.MaxInt
		for i, p := range pal {
			q := p.(color.RGBA)
			dr, dg, db := int(c.R)-int(q.R), int(c.G)-int(q.G), int(c.B)-int(q.B)
			if d := dr*dr + dg*dg + db*db; d < bestD {
				best, bestD = i, d
			}
		}
		index[c] = uint8(best)
	}
	out := image.NewPaletted(bounds, pal)
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			out.SetColorIndex(x, y, index[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)])
		}
	}
	return out
}

// TestDashboardInChromium drives /ui in headless Chromium against a running
// balancer and simulated fleet: every replica and its state is shown,
// routing decisions come with their explanation (session keys hidden until
// the admin token is given), an ejection shows within 2 s of the admin API
// reporting it, the session filter works, and drain goes through the admin
// API with the token.
func TestDashboardInChromium(t *testing.T) {
	exe := chromium(t)
	start := time.Now()
	fleet, admin := fleetWithBalancer(t)
	t.Logf("%v: fleet and balancer up", time.Since(start).Round(time.Millisecond))

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.WindowSize(1366, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelTimeout()

	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1366, 900), chromedp.Navigate(admin+"/ui")); err != nil {
		t.Fatal(err)
	}

	t.Logf("%v: page loaded", time.Since(start).Round(time.Millisecond))
	// Every replica with its state, and decisions with their explanation.
	// A scrape slowed past its timeout on a busy machine (-race, Chromium and
	// the fleet on two cores) can eject a replica, so the checks want every
	// replica shown with its state in words, and LIVE only for the two the
	// test goes on to eject and drain.
	waitPage(t, ctx, "four replicas, sim-1 and sim-4 LIVE, and explained decisions",
		`document.querySelectorAll('#replicas tbody tr[data-state]').length === 4 &&
		 document.querySelector('#replicas tr[data-replica="sim-1"]')?.dataset.state === "LIVE" &&
		 document.querySelector('#replicas tr[data-replica="sim-4"]')?.dataset.state === "LIVE" &&
		 document.querySelectorAll('#decisions tbody td.why').length >= 3`, waitFor)
	for _, r := range fleet.Replicas {
		got := pageText(t, ctx, fmt.Sprintf(`document.querySelector('#replicas tr[data-replica=%q] td.state').innerText`, r.Name()))
		named := r.Name() == "sim-1" || r.Name() == "sim-4"
		inWords := strings.Contains(got, "LIVE") || strings.Contains(got, "PROBING") || strings.Contains(got, "EJECTED")
		if !inWords || named && !strings.Contains(got, "LIVE") {
			t.Errorf("%s state cell = %q, want its state in words (LIVE for the replicas the test acts on)", r.Name(), got)
		}
	}
	why := pageText(t, ctx, `document.querySelector('#decisions tbody td.why').innerText`)
	// The fleet runs the default policy, cost: the page says it in cost's
	// terms (the rule, the expected TTFT, the cached tokens), not a pin's.
	if !strings.Contains(why, "expected TTFT") || !strings.Contains(why, "cached tokens") || !strings.Contains(why, "[policy cost]") {
		t.Errorf("decision explanation = %q, want cost's reason for the replica", why)
	}
	// The admin token is configured and not given yet: session keys are
	// fingerprints.
	if s := pageText(t, ctx, `[...document.querySelectorAll('#decisions td.sess')].map(td => td.innerText).find(s => s !== '-') || ''`); !strings.HasPrefix(s, "#") {
		t.Errorf("session shown without the token = %q, want a fingerprint", s)
	}

	// An ejection: the page shows it within 2 s of the admin API.
	if err := fleet.Replica("sim-4").SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
		t.Fatal(err)
	}
	reported := waitAdmin(t, admin, "sim-4 EJECTED", func(m map[string]balancer.ReplicaStatus) bool {
		return m["sim-4"].State == "EJECTED"
	})
	waitPage(t, ctx, "sim-4 EJECTED", `document.querySelector('#replicas tr[data-replica="sim-4"]').dataset.state === "EJECTED"`, 10*time.Second)
	if lag := time.Since(reported); lag > ejectionShownWithin {
		t.Errorf("the page showed the ejection %v after the admin API, want at most %v", lag, ejectionShownWithin)
	} else {
		t.Logf("ejection shown %v after the admin API reported it", lag.Round(time.Millisecond))
	}
	waitPage(t, ctx, "the ejection in the health events",
		`[...document.querySelectorAll('#events li')].some(li => li.innerText.includes('sim-4') && li.innerText.includes('EJECTED'))`, 5*time.Second)

	// The token: session keys in full, then drain through the admin API.
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), adminToken),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
	); err != nil {
		t.Fatal(err)
	}
	waitPage(t, ctx, "the token accepted", `document.getElementById('token-state').innerText === 'token accepted'`, 10*time.Second)
	waitPage(t, ctx, "session keys in full",
		`[...document.querySelectorAll('#decisions td.sess')].some(td => td.innerText.startsWith('user'))`, waitFor)
	// The replica table is redrawn on every refresh, so a button found by
	// one DevTools call may be gone by the next (chromedp.Click failed so:
	// "Could not find node with given id"). Finding and clicking it in one
	// script leaves no gap; the page's delegated handler gets the click.
	waitPage(t, ctx, "a Drain button for sim-1 to click", `(() => {
		const b = document.querySelector('button[data-action="drain"][data-name="sim-1"]');
		if (!b) return false;
		b.click();
		return true;
	})()`, 10*time.Second)
	waitAdmin(t, admin, "sim-1 draining", func(m map[string]balancer.ReplicaStatus) bool { return m["sim-1"].Draining })
	waitPage(t, ctx, "sim-1 draining",
		`!!document.querySelector('#replicas tr[data-replica="sim-1"] .st-draining') &&
		 !!document.querySelector('button[data-action="undrain"][data-name="sim-1"]')`, 10*time.Second)

	t.Logf("%v: drained", time.Since(start).Round(time.Millisecond))
	if os.Getenv("LLMLB_UI_SCREENSHOTS") != "" {
		// Refreshing the docs: let the traffic-share history fill a few
		// buckets first, so the pictures show more than a start.
		time.Sleep(45 * time.Second)
	}
	screenshot(t, ctx, "ui-1366.png", 1366, 900)
	screenshot(t, ctx, "ui-1920.png", 1920, 1080)

	// The session filter keeps only that session's decisions.
	// The session with the most decisions on the page, for a telling picture.
	session := pageText(t, ctx, `(() => { const n = {};
		for (const td of document.querySelectorAll('#decisions td.sess')) if (td.title) n[td.title] = (n[td.title] || 0) + 1;
		return (Object.entries(n).sort((a, b) => b[1] - a[1])[0] || [''])[0]; })()`)
	if session == "" {
		t.Fatal("no decision with a session key")
	}
	t.Logf("%v: screenshots taken", time.Since(start).Round(time.Millisecond))
	if err := chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("filter"), session)); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: filter typed", time.Since(start).Round(time.Millisecond))
	waitPage(t, ctx, "only "+session+"'s decisions", fmt.Sprintf(
		`(() => { const s = [...document.querySelectorAll('#decisions tbody td.sess')].map(td => td.title);
		          return s.length > 0 && s.every(k => k.toLowerCase().includes(%q)); })()`, strings.ToLower(session)), 5*time.Second)
	screenshot(t, ctx, "ui-filter.png", 1366, 900)
}
