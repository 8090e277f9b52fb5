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

// replicaColor spreads replicas over the hue circle.
func replicaColor(i, n int) string {
	return fmt.Sprintf("hsl(%d,65%%,%d%%)", (i*360/max(n, 1)+200)%360, 45+10*(i%2))
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
		HitRate:  template.HTML(rep.barSVG("prefix-cache hit rate", func(r Result) float64 { return r.PrefixHitRate }, pct)),
		P99:      template.HTML(rep.barSVG("TTFT p99", func(r Result) float64 { return r.TTFT.P99 }, fmtSec)),
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
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:13px}
svg{background:#fff;border:1px solid #ddd;margin:.5em 0}
svg text{font-family:system-ui,sans-serif;font-size:12px}
h2{margin-top:1.5em}
</style></head><body>
<h1>llmlb bench: {{.R.Workload}}</h1>
<p>{{.R.Replicas}} replicas of <code>{{.R.Profile}}</code>, {{.Duration}} of virtual time, seed {{.R.Seed}}.
Every policy ran on fresh engines with the same workload; routing used llmlb's own core.</p>
<pre>{{.Table}}</pre>
<h2>Time to first token (CDF)</h2>
<p>Fraction of requests with TTFT at most x; the vertical axis is stretched towards the tail (p90, p99, p99.9 equally spaced).</p>
{{.CDF}}
<h2>TTFT p99 per policy</h2>
{{.P99}}
<h2>Prefix-cache hit rate per policy</h2>
{{.HitRate}}
<h2>Traffic share per replica over time</h2>
<p>Share of routed prompt tokens per replica and window (stacked; an even split is flat bands of equal height).</p>
{{range .Shares}}{{.}}
{{end}}
</body></html>
`))

// cdfSVG draws one TTFT CDF curve per policy on a logarithmic time axis.
func (rep *Report) cdfSVG() string {
	const W, H, left, right, top, bottom = 760.0, 380.0, 60.0, 150.0, 20.0, 40.0
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
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, W, H, W, H)
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
		// Every other policy dashed: policies that behave alike on a
		// workload (rr and sticky without sessions) draw the same curve.
		dash := ""
		if i%2 == 1 {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`, policyColor(i), dash, strings.TrimSpace(pts.String()))
		ly := top + 10 + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`, left+pw+12, ly, left+pw+32, ly, policyColor(i), dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, left+pw+38, ly+4, template.HTMLEscapeString(r.Policy))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// barSVG draws one horizontal bar per policy.
func (rep *Report) barSVG(title string, value func(Result) float64, label func(float64) string) string {
	const W, left, right, bar, gap = 760.0, 130.0, 90.0, 22.0, 8.0
	H := 30 + float64(len(rep.Results))*(bar+gap)
	top := 0.0
	for _, r := range rep.Results {
		top = max(top, value(r))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`,
		W, H, W, H, template.HTMLEscapeString(title))
	pw := W - left - right
	for i, r := range rep.Results {
		v := value(r)
		w := 0.0
		if top > 0 {
			w = pw * v / top
		}
		yy := 10 + float64(i)*(bar+gap)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-8, yy+bar*0.7, template.HTMLEscapeString(r.Policy))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, left, yy, w, bar, policyColor(i))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`, left+w+6, yy+bar*0.7, template.HTMLEscapeString(label(v)))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// shareSVG draws one policy's per-replica traffic share over time as stacked
// areas (each window sums to 1 when anything was routed).
func shareSVG(r Result, n int) string {
	const W, H, left, right, top, bottom = 760.0, 200.0, 60.0, 20.0, 24.0, 30.0
	pw, ph := W-left-right, H-top-bottom
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f">`, W, H, W, H)
	fmt.Fprintf(&b, `<text x="%.1f" y="16" font-weight="bold">%s</text>`, left, template.HTMLEscapeString(r.Policy))
	fmt.Fprintf(&b, `<text x="%.1f" y="16" text-anchor="end">imbalance %.2f, max share %.1f%%</text>`, left+pw, r.ImbalanceIndex, 100*r.MaxReplicaShare)
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
