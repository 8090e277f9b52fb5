package bench

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// palette colours policies in charts (colour-blind friendly, Okabe-Ito).
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000"}

func policyColor(i int) string { return palette[i%len(palette)] }

// dashes gives every policy its own line pattern, so that policies which
// behave alike on a workload (rr and sticky without sessions) and draw the
// same curve stay distinguishable where they overlap.
var dashes = []string{"", "8 4", "2 3", "12 4 3 4", "5 5", "1 4", "16 4", "4 2 1 2"}

func policyDash(i int) string {
	if d := dashes[i%len(dashes)]; d != "" {
		return fmt.Sprintf(` stroke-dasharray="%s"`, d)
	}
	return ""
}

// replicaColor is the Okabe-Ito palette for small fleets; larger ones spread
// over the hue circle.
func replicaColor(i, n int) string {
	if n <= len(palette) {
		return palette[i]
	}
	return fmt.Sprintf("hsl(%d,65%%,%d%%)", (i*360/max(n, 1)+200)%360, 45+10*(i%2))
}

// chartWidth is the width of every chart's viewBox; the charts scale to the
// page width (width="100%"), text with them.
const chartWidth = 1100.0

// svgOpen starts a chart that takes the page's width and keeps its aspect.
func svgOpen(b *strings.Builder, h float64, label string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="100%%" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`,
		chartWidth, h, template.HTMLEscapeString(label))
}

// WriteHTML writes a self-contained report: the table and inline SVG charts
// (TTFT CDF per policy, prefix-cache hit rate per policy, per-replica traffic
// share over time per policy). It references no external asset.
func (rep *Report) WriteHTML(w io.Writer) error {
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		return err
	}
	data := struct {
		R        *Report
		Table    string
		CDF      template.HTML
		HitRate  template.HTML
		P99      template.HTML
		Shares   []template.HTML
		Duration string
	}{
		R:        rep,
		Table:    table.String(),
		CDF:      template.HTML(rep.cdfSVG()),
		HitRate:  template.HTML(rep.barSVG("prefix-cache hit rate", func(r Result) float64 { return r.PrefixHitRate }, pct, true)),
		P99:      template.HTML(rep.barSVG("TTFT p99", func(r Result) float64 { return r.TTFT.P99 }, fmtSec, false)),
		Duration: fmtDur(rep.DurationSeconds),
	}
	for _, r := range rep.Results {
		data.Shares = append(data.Shares, template.HTML(shareSVG(r, rep.Replicas)))
	}
	if err := htmlTemplate.Execute(w, data); err != nil {
		return fmt.Errorf("bench: html: %w", err)
	}
	return nil
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

var htmlTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>llmlb bench: {{.R.Workload}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em auto;padding:0 2em;max-width:1400px;color:#222}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:13px}
svg{display:block;width:100%;height:auto;background:#fff;border:1px solid #ddd;margin:.5em 0}
svg text{font-family:system-ui,sans-serif;font-size:13px}
h2{margin-top:1.5em}
</style></head><body>
<h1>llmlb bench: {{.R.Workload}}</h1>
<p>{{.R.Replicas}} replicas of <code>{{.R.Profile}}</code>, {{.Duration}} of virtual time, seed {{.R.Seed}}{{if .R.Flaps}}, flapping {{range $i, $f := .R.Flaps}}{{if $i}}, {{end}}<code>{{$f}}</code>{{end}}{{end}}{{if .R.Slow}}, slower {{range $i, $s := .R.Slow}}{{if $i}}, {{end}}<code>{{$s}}</code>{{end}}{{end}}.
Every policy ran on fresh engines with the same workload; routing used llmlb's own core.</p>
<pre>{{.Table}}</pre>
<h2>Time to first token (CDF)</h2>
<p>Fraction of requests with TTFT at most x; the vertical axis is stretched towards the tail (p90, p99, p99.9 equally spaced).</p>
{{.CDF}}
<h2>TTFT p99 per policy</h2>
{{.P99}}
<h2>Prefix-cache hit rate per policy</h2>
<p>When every policy's hit rate is high, the axis starts above 0 (its first tick says where) so that the differences show.</p>
{{.HitRate}}
<h2>Traffic share per replica over time</h2>
<p>Share of routed prompt tokens per replica and window (stacked; an even split is flat bands of equal height; the legend under each chart names the replicas, bottom band first).</p>
{{range .Shares}}{{.}}
{{end}}
</body></html>
`))

// cdfSVG draws one TTFT CDF curve per policy on a logarithmic time axis.
func (rep *Report) cdfSVG() string {
	const W, H, left, right, top, bottom = chartWidth, 440.0, 60.0, 170.0, 20.0, 40.0
	lo, hi := math.Inf(1), 0.0
	for _, r := range rep.Results {
		for _, q := range r.TTFTQuantiles {
			if q.Seconds > 0 {
				lo = min(lo, q.Seconds)
				hi = max(hi, q.Seconds)
			}
		}
	}
	var b strings.Builder
	svgOpen(&b, H, "TTFT CDF per policy")
	if hi == 0 {
		b.WriteString(`<text x="20" y="30">no requests</text></svg>`)
		return b.String()
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	pw, ph := W-left-right, H-top-bottom
	x := func(s float64) float64 {
		s = max(s, lo)
		return left + pw*(math.Log10(s)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	// The probability axis is a percentile scale (-log10(1-p)): 0, 0.9,
	// 0.99 and 0.999 are equally spaced, so the tail, where policies
	// differ, is visible; the top edge is the maximum.
	const yTop = 3.3
	y := func(p float64) float64 {
		v := -math.Log10(max(1-p, math.Pow(10, -yTop)))
		return top + ph*(1-v/yTop)
	}
	// Axes and grid.
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, x(d), top, x(d), top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(d), top+ph+16, fmtSec(d))
	}
	for _, p := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
		label := fmt.Sprintf("p%g", 100*p)
		if p == 1 {
			label = "max"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, left, y(p), left+pw, y(p))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-4, y(p)+4, label)
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`, left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">TTFT (log scale)</text>`, left+pw/2, H-6)
	for i, r := range rep.Results {
		var pts strings.Builder
		for _, q := range r.TTFTQuantiles {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(q.Seconds), y(q.P))
		}
		dash := policyDash(i)
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, policyColor(i), dash, strings.TrimSpace(pts.String()))
		ly := top + 10 + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`, left+pw+12, ly, left+pw+42, ly, policyColor(i), dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, left+pw+48, ly+4, template.HTMLEscapeString(r.Policy))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// barSVG draws one horizontal bar per policy on an axis from 0, or, when
// zoom is set and every value is high (at least half the largest), from a
// round value below the smallest one, so that close rates can be told apart.
func (rep *Report) barSVG(title string, value func(Result) float64, label func(float64) string, zoom bool) string {
	const W, left, right, bar, gap, axis = chartWidth, 130.0, 90.0, 22.0, 8.0, 28.0
	H := 14 + float64(len(rep.Results))*(bar+gap) + axis
	lo, hi := barAxis(rep.Results, value, zoom)
	var b strings.Builder
	svgOpen(&b, H, title)
	pw := W - left - right
	x := func(v float64) float64 {
		if hi <= lo {
			return left
		}
		return left + pw*(min(max(v, lo), hi)-lo)/(hi-lo)
	}
	for i, r := range rep.Results {
		v := value(r)
		yy := 10 + float64(i)*(bar+gap)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-8, yy+bar*0.7, template.HTMLEscapeString(r.Policy))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, left, yy, x(v)-left, bar, policyColor(i))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, x(v)+6, yy+bar*0.7, template.HTMLEscapeString(label(v)))
	}
	// The axis, with its start written out (it is not always 0).
	ay := H - axis + 4
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`, left, ay, left+pw, ay)
	for _, v := range niceTicks(lo, hi) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999"/>`, x(v), ay, x(v), ay+4)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, x(v), ay+18, template.HTMLEscapeString(label(v)))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// niceTicks returns the axis start and round values (steps of 1, 2 or 5
// times a power of ten) up to hi, about four of them.
func niceTicks(lo, hi float64) []float64 {
	if hi <= lo {
		return nil
	}
	raw := (hi - lo) / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	ticks := []float64{lo}
	for v := math.Ceil(lo/step+1e-9) * step; v <= hi*(1+1e-9); v += step {
		if v-lo > step/2 {
			ticks = append(ticks, v)
		}
	}
	return ticks
}

// barAxis returns the value axis of a bar chart: [0, max], or with zoom and
// values that are all at least half the largest, [a tenth below the
// smallest rounded down to a tenth of the largest's scale, max].
func barAxis(results []Result, value func(Result) float64, zoom bool) (lo, hi float64) {
	smallest := math.Inf(1)
	for _, r := range results {
		v := value(r)
		hi = max(hi, v)
		smallest = min(smallest, v)
	}
	if !zoom || hi <= 0 || smallest < hi/2 {
		return 0, hi
	}
	step := math.Pow(10, math.Ceil(math.Log10(hi))-1) // 0.1 for rates in (0.1, 1]
	lo = max(0, math.Floor(smallest/step)*step-step)
	if hi-lo < step { // all equal: still show a bar
		lo = max(0, lo-step)
	}
	return lo, hi
}

// shareSVG draws one policy's per-replica traffic share over time as stacked
// areas (each window sums to 1 when anything was routed), with a legend
// naming the replicas.
func shareSVG(r Result, n int) string {
	const W, left, right, top, bottom = chartWidth, 60.0, 20.0, 24.0, 30.0
	const ph, legendRow, legendCol = 170.0, 20.0, 120.0
	pw := W - left - right
	// The legend: one entry per replica (at most 16; larger fleets say how
	// the colours run).
	shown := min(n, 16)
	perRow := max(1, int(pw/legendCol))
	rows := (shown + perRow - 1) / perRow
	if n > shown {
		rows++
	}
	H := top + ph + bottom + float64(rows)*legendRow + 6
	var b strings.Builder
	svgOpen(&b, H, "traffic share per replica, "+r.Policy)
	fmt.Fprintf(&b, `<text x="%.1f" y="16" font-weight="bold">%s</text>`, left, template.HTMLEscapeString(r.Policy))
	fmt.Fprintf(&b, `<text x="%.1f" y="16" text-anchor="end">imbalance %.2f, max share %.1f%%</text>`, left+pw, r.ImbalanceIndex, 100*r.MaxReplicaShare)
	ly := top + ph + bottom + 12
	for i := range shown {
		lx := left + float64(i%perRow)*legendCol
		y := ly + float64(i/perRow)*legendRow
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="14" height="12" fill="%s"/>`, lx, y-10, replicaColor(i, n))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, lx+20, y, template.HTMLEscapeString(replicaName(i)))
	}
	if n > shown {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">... and %d more: the colours run on around the hue circle up to %s</text>`,
			left, ly+float64(rows-1)*legendRow, n-shown, template.HTMLEscapeString(replicaName(n-1)))
	}
	k := len(r.Share)
	if k == 0 {
		b.WriteString(`</svg>`)
		return b.String()
	}
	colW := pw / float64(k)
	// Each window is a column of stacked rectangles: exact, cheap to draw, and
	// honest about windows with no traffic (left blank).
	for wi, shares := range r.Share {
		acc := 0.0
		for i, s := range shares {
			if s <= 0 {
				continue
			}
			h := ph * s
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"/>`,
				left+float64(wi)*colW, top+ph-acc-h, colW+0.3, h, replicaColor(i, n))
			acc += h
		}
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`, left, top, pw, ph)
	for _, p := range []float64{0, 0.5, 1} {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f%%</text>`, left-4, top+ph*(1-p)+4, 100*p)
	}
	total := float64(k) * r.ShareWindowSeconds
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, left+pw*f, top+ph+16, fmtDur(math.Round(total*f)))
	}
	b.WriteString(`</svg>`)
	return b.String()
}
