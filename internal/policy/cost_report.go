package policy

import "math"

// The expected time to first token a decision reports (Choice.Estimate,
// checked against the first token by the balancer and the benchmark) is
// the prefill model's (cost_prefill.go) times a correction learned per
// class of decision: the median of measured / modelled over the first
// tokens of decisions of the same class on the same replica (or, while the
// replica has too few of them, on the fleet).
//
// The prefill model is fitted to every first token alike, so it is right
// on average and wrong in opposite directions for decisions that differ in
// what the model cannot price. On an engine that shares its steps among
// prefills a request with nothing of ours pending ahead (idle) shares its
// steps with the rest of its burst, sent after it, while one sent behind
// pending prefill finds some of it done: one scale for both left the idle
// ones too long at 4 slots and too short at 16 (agentic, parallel prefill,
// median estimate / measured 1.13 and 0.90 idle, 0.97 and 1.06 loaded). A
// full batch makes a new request wait for a slot at a rate the slot price
// only roughly knows. So the class is: whether prefill of ours was pending
// ahead, the request's place in its session's burst (burstBucket), how
// full the replica's batch is (in flight over its slots: under half, under
// full, full), how many requests are ahead of it (0-3+) and how much work
// (log2(1 + tokens ahead / an eighth of batch_tokens), 0-5+). The fleet's
// median of a class is weighed against its coarse class's (idle or not,
// and the batch's fullness) as against a prior worth reportPrior first
// tokens: on 4-slot replicas, whose runs have a tenth of the first
// tokens, most fine classes stay cold.
//
// Only the report changes: the score, the burst window and the prefill
// model keep the model's time, so routing is what it was. (Applied to
// routing, earlier calibrations of the estimate moved the load they were
// measured on: docs/ROUTING.md, "Prefill concurrency".)
//
// Each cell is a running median in log space: a step of reportStep (at
// first 1/2n, so that the first samples average) towards each sample's log
// ratio, so that half of the cell's first tokens come under its estimate
// and half over; the relative error a median estimate leaves is the
// smallest a single factor leaves under noise that is symmetric in log.
const (
	reportPlaces   = 6 // burst buckets told apart: 0-4, then 5+
	reportFull     = 3 // batch under half, under full, full
	reportRequests = 4 // requests ahead: 0, 1, 2, 3+
	reportAhead    = 6 // work ahead: log2(1 + tokens / (batch_tokens / 8)), 0-4, 5+
	reportClasses  = 2 * reportPlaces * reportFull * reportRequests * reportAhead
	// reportMin is the first tokens a cell needs before its factor is
	// used: below it the replica's cell gives way to the fleet's, and a
	// coarse class's to no correction.
	reportMin = 32
	// reportPrior is the first tokens the coarse class's median counts
	// for against a fine class's on the fleet (8 counted alike; taking
	// the coarse class's only below reportMin cost 16-slot serial
	// replicas 0.3 points idle).
	reportPrior = 32
	// reportStep is a cell's step in log space once warmed up (0.015
	// and 0.05 were measured: they follow the noise).
	reportStep = 0.005
	// maxReportLog bounds one sample's log ratio, as maxPrefillLogError
	// does the model's: a request held up by a stall moves the median
	// as far as any other that took longer than expected.
	maxReportLog = 2
)

// reportCell is one class's running median of log(measured / modelled),
// in 8 bytes: a replica has 864 of them.
type reportCell struct {
	log float32
	n   uint32
}

// step moves c towards the log ratio y.
func (c *reportCell) step(y float64) {
	s, l := max(reportStep, 0.5/float64(c.n+1)), float64(c.log)
	switch {
	case y > l:
		c.log = float32(min(l+s, y))
	case y < l:
		c.log = float32(max(l-s, y))
	}
	c.n = min(c.n+1, math.MaxUint32-1)
}

// reportFit is the report's correction: a cell per class for the fleet
// and for each replica (by id), and one per coarse class for the fleet.
type reportFit struct {
	fleet  [reportClasses]reportCell
	coarse [2 * reportFull]reportCell
	cells  [][reportClasses]reportCell
}

// reportCoarse is class's coarse class: idle or not, and the batch's
// fullness.
func reportCoarse(class int) int {
	c := 0
	if class >= reportClasses/2 {
		c, class = reportFull, class-reportClasses/2
	}
	return c + class/(reportRequests*reportAhead)%reportFull
}

// reportClass is a decision's class: idle (no prefill of ours pending
// ahead on the replica), its place in its session's burst (burstBucket),
// the replica's in-flight requests over its slots, the requests ahead of
// it (ours pending and others waiting) and their tokens, ahead, against
// the step's budget of batch tokens.
func reportClass(idle bool, burst int, inFlight, slots, requests, ahead, batch float64) int {
	full := 0
	if u := inFlight / max(slots, 1); u >= 1 {
		full = 2
	} else if u >= 0.5 {
		full = 1
	}
	req := 0
	if requests > 0 && !math.IsNaN(requests) {
		req = int(min(requests, reportRequests-1))
	}
	work := 0
	if ahead > 0 && batch > 0 {
		work = int(min(math.Log2(1+ahead/(batch/8)), reportAhead-1))
	}
	class := min(max(burst, 0), reportPlaces-1)
	class = class*reportFull + full
	class = class*reportRequests + req
	class = class*reportAhead + work
	if !idle {
		class += reportClasses / 2
	}
	return class
}

// factor is the correction of a modelled time to first token of class on
// replica id: the replica's cell once it has reportMin samples, else the
// fleet's, weighed against its coarse class's (once that has reportMin)
// as against reportPrior samples.
func (f *reportFit) factor(id int32, class int) float64 {
	if class < 0 || class >= reportClasses {
		return 1
	}
	if id >= 0 && int(id) < len(f.cells) && f.cells[id][class].n >= reportMin {
		return math.Exp(float64(f.cells[id][class].log))
	}
	prior := 0.0
	if c := &f.coarse[reportCoarse(class)]; c.n >= reportMin {
		prior = float64(c.log)
	}
	fl := &f.fleet[class]
	n := float64(fl.n)
	return math.Exp((n*float64(fl.log) + reportPrior*prior) / (n + reportPrior))
}

// add folds in a first token of replica id that took measured seconds
// against modelled: the cells of its class and coarse class take a step. A sample without
// a positive time or model is skipped.
func (f *reportFit) add(id int32, class int, modelled, measured float64) {
	if id < 0 || class < 0 || class >= reportClasses || !(modelled > 0) || !(measured > 0) ||
		math.IsInf(modelled, 0) || math.IsInf(measured, 0) {
		return
	}
	for len(f.cells) <= int(id) {
		f.cells = append(f.cells, [reportClasses]reportCell{})
	}
	y := min(max(math.Log(measured/modelled), -maxReportLog), maxReportLog)
	f.cells[id][class].step(y)
	f.fleet[class].step(y)
	f.coarse[reportCoarse(class)].step(y)
}

// forget drops replica id's cells (a restarted replica may run with other
// engine flags); the fleet's stay.
func (f *reportFit) forget(id int32) {
	if id >= 0 && int(id) < len(f.cells) {
		f.cells[id] = [reportClasses]reportCell{}
	}
}

// reported is the expected time to first token candidate i of the
// decision just priced reports: its modelled time, corrected for its
// class.
func (p *Cost) reported(i int) float64 {
	return p.shapes[i].Modelled * p.report.factor(p.candID[i], p.shapes[i].Class)
}
