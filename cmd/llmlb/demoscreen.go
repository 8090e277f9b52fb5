package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/traffic"
	"github.com/llmlb/llmlb/internal/ui"
)

// ANSI sequences of the redrawn screen.
const (
	ansiClear      = "\x1b[2J\x1b[H"
	ansiHome       = "\x1b[H"
	ansiClearLine  = "\x1b[K"
	ansiClearBelow = "\x1b[J"
	ansiHideCursor = "\x1b[?25l"
	ansiShowCursor = "\x1b[?25h"
	ansiReset      = "\x1b[0m"
)

// stateColor colours a state on the screen; the state is always written
// out too, so the colour is a help, never the only signal.
var stateColor = map[string]string{"LIVE": "\x1b[32m", "PROBING": "\x1b[33m", "EJECTED": "\x1b[1;31m"}

// demoScreen renders the demo's output: a screen redrawn in place (ansi) or
// one plain line per tick.
type demoScreen struct {
	ui, proxy, admin, logPath string
	policy, profile, model    string
	users, replicas           int
	ansi                      bool
	start                     time.Time
	episode                   *episode // nil when no replica flaps
}

// frame is what one redraw shows.
type frame struct {
	elapsed time.Duration
	snap    *ui.Snapshot
	traffic traffic.Summary
}

// clockOf formats an elapsed time as m:ss.
func clockOf(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

func (sc *demoScreen) color(state string) string { return sc.colorPadded(state, 0) }

// colorPadded colours state padded to width (the padding inside the colour,
// so that columns stay aligned).
func (sc *demoScreen) colorPadded(state string, width int) string {
	padded := fmt.Sprintf("%-*s", width, state)
	if !sc.ansi {
		return padded
	}
	return stateColor[state] + padded + ansiReset
}

// writeHeader prints the plain mode's header: the dashboard's URL first.
func (sc *demoScreen) writeHeader(out io.Writer) {
	fmt.Fprintf(out, "llmlb demo: dashboard %s\n", sc.ui)
	fmt.Fprintf(out, "  proxy  %s   (OpenAI-compatible)\n", sc.proxy)
	fmt.Fprintf(out, "  admin  %s/admin/replicas   %s/metrics\n", sc.admin, sc.admin)
	fmt.Fprintf(out, "  logs   %s\n", sc.logPath)
	fmt.Fprintf(out, "%d simulated %s replicas (model %q) behind the balancer (policy %s), %d agent users.\n",
		sc.replicas, sc.profile, sc.model, sc.policy, sc.users)
	if sc.episode != nil {
		fmt.Fprintf(out, "At %s replica %s starts to flap: watch it go EJECTED -> PROBING -> LIVE.\n",
			clockOf(sc.episode.after), sc.episode.victim)
	}
	fmt.Fprintf(out, "try: %s\nCtrl-C stops the demo.\n", sc.curl())
}

func (sc *demoScreen) curl() string {
	return fmt.Sprintf(`curl %s/v1/chat/completions -H 'Content-Type: application/json' -H 'X-Session-Id: me' `+
		`-d '{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":16}'`, sc.proxy, sc.model)
}

// writeScreen redraws the whole screen in place.
func (sc *demoScreen) writeScreen(out io.Writer, f frame) {
	var b strings.Builder
	b.WriteString(ansiHome)
	for _, line := range sc.screenLines(f) {
		b.WriteString(line)
		b.WriteString(ansiClearLine + "\n")
	}
	b.WriteString(ansiClearBelow)
	_, _ = io.WriteString(out, b.String())
}

// screenLines is the screen's content, top to bottom.
func (sc *demoScreen) screenLines(f frame) []string {
	s := f.snap
	lines := []string{
		fmt.Sprintf("llmlb demo   dashboard %s   %s elapsed", sc.ui, clockOf(f.elapsed)),
		fmt.Sprintf("proxy %s   admin %s   logs %s", sc.proxy, sc.admin, sc.logPath),
		fmt.Sprintf("%d simulated %s replicas, policy %s, %d agent users; Ctrl-C stops", sc.replicas, sc.profile, sc.policy, sc.users),
		"",
	}
	width := len("replica")
	for _, r := range s.Replicas {
		width = max(width, len(r.Name))
	}
	lines = append(lines, fmt.Sprintf("%-*s  %-9s %8s %8s %8s %8s %9s %8s %11s %6s %9s",
		width, "replica", "state", "in state", "running", "waiting", "load", "in flight", "KV cache", "prefix hits", "share", "ejections"))
	for _, r := range s.Replicas {
		note := ""
		switch {
		case r.State == "EJECTED" && r.CooldownLeftSeconds > 0:
			note = fmt.Sprintf("  cooldown %s left", clockOf(time.Duration(r.CooldownLeftSeconds*float64(time.Second))))
		case r.Draining:
			note = "  draining"
		}
		hit := "-"
		if r.PrefixHitRate != nil {
			hit = fmt.Sprintf("%.0f%%", 100**r.PrefixHitRate)
		}
		lines = append(lines, fmt.Sprintf("%-*s  %s %8s %8.0f %8.0f %8.1f %9d %7.0f%% %11s %5.0f%% %9d%s",
			width, r.Name, sc.colorPadded(r.State, 9), clockOf(time.Duration(r.StateSeconds*float64(time.Second))),
			r.Running, r.Waiting, r.Load, r.InFlight, 100*r.KVCacheUsage, hit, 100*r.Share, r.Ejections, note))
	}
	t := f.traffic
	lines = append(lines, "",
		fmt.Sprintf("decisions/s %.1f   requests %d (ok %d, failed %d%s)   TTFT p50 %s p99 %s   imbalance %.2f",
			s.Fleet.RequestsPerSecond, t.Requests, t.OK, t.Failed, failureNote(t),
			fmtSeconds(s.Fleet.TTFTp50Seconds), fmtSeconds(s.Fleet.TTFTp99Seconds), s.Fleet.ImbalanceIndex))
	alerts := "none"
	if len(s.Alerts) > 0 {
		names := make([]string, len(s.Alerts))
		for i, a := range s.Alerts {
			names[i] = a.Message
		}
		alerts = strings.Join(names, "; ")
	}
	lines = append(lines, "alerts      "+alerts)
	if sc.episode != nil {
		lines = append(lines, "episode     "+sc.episode.line(sc.color))
	}
	if len(s.Transitions) > 0 {
		tr := s.Transitions[0]
		ev := fmt.Sprintf("%s %s %s -> %s: %s", clockOf(tr.At.Sub(sc.start)), tr.Replica, tr.From, tr.To, tr.Cause)
		lines = append(lines, "last event  "+truncate(ev, 110))
	}
	lines = append(lines, "", "try: "+sc.curl())
	return lines
}

// writeLine prints one plain line: elapsed, decisions/s, every replica's
// state and share, and the episode.
func (sc *demoScreen) writeLine(out io.Writer, f frame) {
	var b strings.Builder
	fmt.Fprintf(&b, "[%s] %.1f decisions/s, %d requests (%d failed%s)", clockOf(f.elapsed), f.snap.Fleet.RequestsPerSecond, f.traffic.Requests, f.traffic.Failed, failureNote(f.traffic))
	for _, r := range f.snap.Replicas {
		fmt.Fprintf(&b, " | %s %s %.0f%%", r.Name, r.State, 100*r.Share)
	}
	if sc.episode != nil {
		b.WriteString(" | episode: " + sc.episode.line(func(s string) string { return s }))
	}
	b.WriteByte('\n')
	_, _ = io.WriteString(out, b.String())
}

// failureNote says what the failed requests were, for the status line:
// ": 5 cut mid-stream" (a stream broken after its first byte, which no
// balancer can retry without replaying what the client has seen: the
// flapping replica went down under it), ": 2 HTTP 503", ": 1 no answer"
// (no response at all). "" when none failed.
func failureNote(t traffic.Summary) string {
	if t.Failed == 0 {
		return ""
	}
	midStream, noAnswer := 0, 0
	for class, n := range t.Errors {
		if strings.HasPrefix(class, "traffic: stream") || strings.HasPrefix(class, "traffic: reading stream") {
			midStream += n
		}
	}
	var parts []string
	if midStream > 0 {
		parts = append(parts, fmt.Sprintf("%d cut mid-stream", midStream))
	}
	statuses := make([]int, 0, len(t.ByStatus))
	for st := range t.ByStatus {
		statuses = append(statuses, st)
	}
	slices.Sort(statuses)
	for _, st := range statuses {
		switch n := t.ByStatus[st]; {
		case st == 0:
			noAnswer += n
		case st != http.StatusOK:
			parts = append(parts, fmt.Sprintf("%d HTTP %d", n, st))
		}
	}
	if noAnswer > 0 {
		parts = append(parts, fmt.Sprintf("%d no answer", noAnswer))
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

func fmtSeconds(s float64) string {
	switch {
	case s <= 0:
		return "-"
	case s < 1:
		return fmt.Sprintf("%.0fms", 1000*s)
	default:
		return fmt.Sprintf("%.2fs", s)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// episode follows the flapping replica from the start of the flap through
// its health states back to LIVE.
type episode struct {
	victim                string
	after, period, length time.Duration // when the flap starts, its cycle, how long it lasts

	started, over    bool
	startedAt, endAt time.Duration // elapsed at the flap's start and end
	steps            []episodeStep // states entered since the flap began, in order
	lastAt           time.Time     // of the latest transition taken into steps
}

type episodeStep struct {
	state string
	at    time.Duration // elapsed
}

func (e *episode) flapping(at time.Duration)  { e.started, e.startedAt = true, at }
func (e *episode) recovered(at time.Duration) { e.over, e.endAt = true, at }

// observe takes the victim's new transitions (newest first, as in a
// snapshot) since the flap began into the episode.
func (e *episode) observe(start time.Time, ts []ui.Transition) {
	if !e.started {
		return
	}
	from := start.Add(e.startedAt)
	for i := len(ts) - 1; i >= 0; i-- {
		t := ts[i]
		if t.Replica != e.victim || t.At.Before(from) || !t.At.After(e.lastAt) {
			continue
		}
		e.steps = append(e.steps, episodeStep{state: t.To, at: t.At.Sub(start)})
		e.lastAt = t.At
	}
}

// back reports whether the episode is complete: the flap is over and the
// replica returned to LIVE after having been ejected.
func (e *episode) back() (ejectedAt, liveAt time.Duration, ok bool) {
	if !e.over || len(e.steps) == 0 || e.steps[len(e.steps)-1].state != "LIVE" {
		return 0, 0, false
	}
	for _, s := range e.steps {
		if s.state == "EJECTED" {
			return s.at, e.steps[len(e.steps)-1].at, true
		}
	}
	return 0, 0, false
}

// line is the episode in one line, e.g.
// "sim-4 flapping (0:10) -> EJECTED (0:11) -> PROBING (0:23) -> LIVE (0:34)".
func (e *episode) line(color func(string) string) string {
	if !e.started {
		return fmt.Sprintf("%s starts to flap at %s (down/up every %s for %s)", e.victim, clockOf(e.after), e.period, e.length)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s flapping (%s)", e.victim, clockOf(e.startedAt))
	steps := e.steps
	if len(steps) > 7 { // a long flap: the first ejection, then the latest states
		fmt.Fprintf(&b, " -> %s (%s) -> ...", color(steps[0].state), clockOf(steps[0].at))
		steps = steps[len(steps)-5:]
	}
	for _, s := range steps {
		fmt.Fprintf(&b, " -> %s (%s)", color(s.state), clockOf(s.at))
	}
	if ejected, live, ok := e.back(); ok {
		fmt.Fprintf(&b, ": ejection to LIVE in %s", (live - ejected).Round(time.Second))
	} else if e.over {
		fmt.Fprintf(&b, "; recovered at %s, returning through scrapes, PROBING and a clean window", clockOf(e.endAt))
	}
	return b.String()
}
