package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"

	"github.com/llmlb/llmlb/internal/balancer"
)

// PredictionStats is how well a cost-aware policy's expected time to first
// token (its Estimate at the decision) matched the first token the engine
// gave, from the decision to that token: the median relative error
// |estimate - measured| / measured and the median ratio estimate /
// measured (below 1: the replica was slower than expected), over all
// requests and split by whether prefill the balancer had sent was still
// pending ahead of the request on its replica at the decision (idle: none;
// loaded: some).
type PredictionStats struct {
	Samples     int     `json:"samples"`
	ErrorMedian float64 `json:"error_median"`
	RatioMedian float64 `json:"ratio_median"`

	IdleSamples       int     `json:"idle_samples"`
	IdleErrorMedian   float64 `json:"idle_error_median"`
	LoadedSamples     int     `json:"loaded_samples"`
	LoadedErrorMedian float64 `json:"loaded_error_median"`
}

// predictions collects one run's estimate / measured ratios.
type predictions struct {
	idle, loaded []float64
}

// add records one first token: the decision's explanation and the time
// from the decision to the token, in seconds.
func (p *predictions) add(e balancer.Explanation, measured float64) {
	if !(e.Estimate > 0) || !(measured > 0) || math.IsInf(e.Estimate, 0) {
		return
	}
	r := e.Estimate / measured
	if e.PendingPrefill <= 0 {
		p.idle = append(p.idle, r)
	} else {
		p.loaded = append(p.loaded, r)
	}
}

// stats summarises the ratios; nil without any (a policy with no
// estimates).
func (p *predictions) stats() *PredictionStats {
	all := append(slices.Clone(p.idle), p.loaded...)
	if len(all) == 0 {
		return nil
	}
	return &PredictionStats{
		Samples: len(all), ErrorMedian: medianError(all), RatioMedian: Median(all),
		IdleSamples: len(p.idle), IdleErrorMedian: medianError(p.idle),
		LoadedSamples: len(p.loaded), LoadedErrorMedian: medianError(p.loaded),
	}
}

// medianError is the median of |r - 1| over ratios rs (0 for none).
func medianError(rs []float64) float64 {
	errs := make([]float64, len(rs))
	for i, r := range rs {
		errs[i] = math.Abs(r - 1)
	}
	return Median(errs)
}

// Median of xs (0 for none); xs is left as it was.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// writePredictionTable prints the policies' TTFT prediction figures, if
// any policy made estimates.
func (rep *Report) writePredictionTable(w io.Writer) error {
	any := false
	for _, r := range rep.Results {
		any = any || r.TTFTPrediction != nil
	}
	if !any {
		return nil
	}
	fmt.Fprintln(w, "\nTTFT estimates against measured (median |estimate - measured| / measured; ratio estimate / measured; idle: no prefill pending ahead at the decision):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tchecked\terror\tratio\tidle\terror\tloaded\terror\t")
	for _, r := range rep.Results {
		p := r.TTFTPrediction
		if p == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f%%\t%.2f\t%d\t%.0f%%\t%d\t%.0f%%\t\n", r.Policy, p.Samples, 100*p.ErrorMedian, p.RatioMedian,
			p.IdleSamples, 100*p.IdleErrorMedian, p.LoadedSamples, 100*p.LoadedErrorMedian)
	}
	return tw.Flush()
}
