package policy

import "math"

// How a replica's prefill time grows with the prefills it runs at once,
// learned from the first tokens its requests get.
//
// An engine that prefills one prompt at a time (vLLM's default) computes a
// new prompt after all the work ahead of it: its prefill time is that of
// the work ahead plus its own (serial). One that shares each step's token
// budget among up to --max-num-partial-prefills prompts computes each
// request ahead only up to the new prompt's length before the new one is
// done: ahead it finds min(work ahead, requests ahead x its own tokens)
// (shared), and later arrivals share its steps too. Neither the engine's
// /metrics nor its flags say which it is, and a rate learned from its
// prefill histogram is the per-request rate at its usual concurrency, not
// its throughput. So each replica's time to first token is
//
//	ttft = waits + scale x ((1 - shared) x serial time + shared x shared time)
//
// where both times count a decode step per batch_tokens chunk and the
// learned prefill rate, and waits are those for a batch slot and for KV.
// scale and shared are fitted to the replica's first tokens by stochastic
// gradient descent on the log error, from the prior (1, 0): serial, at
// the learned rate. shared moves only on requests that had work ahead
// (the only ones whose two times differ); scale on all.
//
// On an engine that shares its steps, a short prompt is done in a step or
// two whatever else runs, and a long one is stretched by every prefill
// that comes while it computes: measured against the estimate, prompts of
// under 256 tokens to compute took 0.71x of it and those of 1-4K 1.25x
// (agentic, 64 slots, parallel prefill). So the prefill part is also
// scaled by (prompt tokens to compute / 1,024)^size, size fitted per
// replica the same way from 0 (no correction).

// PrefillShape is a decision's expected time to first token on the chosen
// replica split into the parts the replica's prefill model weighs, in
// seconds: Waits (a batch slot, KV), Serial (the work ahead and the prompt
// computed one prompt at a time) and Shared (the same with the prefills
// sharing each step). The balancer hands it back with the measured time
// (FirstTokenObserver).
type PrefillShape struct {
	Waits, Serial, Shared float64
	// Tokens is the prompt tokens the replica computes (not in its cache).
	Tokens float64
	// Burst is the request's place in its session's burst, as a bucket of
	// the replica's burst calibration (burstBucket).
	Burst int
	// Modelled is the model's expected time to first token (waits plus
	// the weighed prefill) and Class the decision's class in the
	// report's correction of it (cost_report.go).
	Modelled float64
	Class    int
	// Hit is the prompt tokens the decision expected cached, Unscheduled
	// the part of them from the first block a request in flight there was
	// still to compute (cost_inflight.go).
	Hit, Unscheduled float64
}

// FirstTokenObserver is implemented by a policy that learns from the time
// each of its requests waited for its first token: the balancer calls it,
// under its lock, with the Choice's Shape and the seconds from the decision
// to the first token.
type FirstTokenObserver interface {
	ObserveFirstToken(replica string, s PrefillShape, measured float64)
}

// Memory and bounds of the fit.
const (
	// prefillStep is the fit's step: each first token moves the scale
	// and the shared share by this share of their log error's gradient,
	// so that about the latest 50 count.
	prefillStep = 0.02
	// maxPrefillLogError bounds one sample's log error (a factor of e^2
	// either way): a request held up by what no estimate sees (a stall, a
	// restart) moves the fit no more than a badly wrong one.
	maxPrefillLogError = 2
	// minPrefillScale and maxPrefillScale bound the scale: no replica's
	// prefill is priced at less than a quarter of what its rate says, and
	// one measured slower than eight times that is down or overloaded,
	// which its queue prices, not its prefill model.
	minPrefillScale, maxPrefillScale = 0.25, 8
	// sizeStep is the size exponent's step per first token: its gradient
	// is the log error times log(tokens / sizeRef), several times the
	// others', so a smaller step moves it as steadily (0.01 was measured;
	// 0.002 did less, 0.05 no better).
	sizeStep = 0.01
	// sizeRef is the prompt size, in tokens, the size exponent leaves as
	// it is: the scale prices prompts of about this size.
	sizeRef = 1024
	// maxSizeExp bounds the size exponent either way: at 1 the prefill
	// grows with the square of the prompt.
	maxSizeExp = 1
)

// prefillFit is the fitted prefill model: a replica's time to first token
// is waits + scale x (tokens / sizeRef)^size x ((1 - shared) x serial time
// + shared x shared time), with the scale the fleet's and the shared share
// and the size exponent each replica's.
//
// The scale is pooled, as the prefill rate it corrects is: priced per
// replica, one that had only answered fast would draw every request, and
// one that never answers (a hung API behind a live /metrics) would keep
// its prior and get none of the requests whose time-outs eject it.
type prefillFit struct {
	scale  float64   // 1 until the first sample
	shared []float64 // by replica id
	seen   []bool    // by replica id: has had a sample
	size   []float64 // by replica id: the exponent of the prompt's size
	// burst is, by replica id, the log of the prefill's factor for a
	// request's place in its session's burst (burstBucket).
	burst   [][burstBuckets]float64
	samples uint64
}

// weights returns replica id's weights of the serial and shared times.
func (f *prefillFit) weights(id int32) (serial, shared float64) {
	scale, a := f.model(id)
	return scale * (1 - a), scale * a
}

// model returns the scale and replica id's shared share, (1, 0) before
// any sample.
func (f *prefillFit) model(id int32) (scale, shared float64) {
	scale = 1
	if f.samples > 0 {
		scale = f.scale
	}
	if int(id) < len(f.shared) {
		shared = f.shared[id]
	}
	return scale, shared
}

// sizeFactor is replica id's correction of a prefill of tokens to compute
// for its size: (tokens / sizeRef)^size, 1 before any sample; a prompt of
// under a block counts as one block.
func (f *prefillFit) sizeFactor(id int32, tokens float64) float64 {
	if id < 0 || int(id) >= len(f.size) || f.size[id] == 0 {
		return 1
	}
	return math.Pow(max(tokens, minSizeTokens)/sizeRef, f.size[id])
}

// minSizeTokens is the smallest prompt the size correction tells apart:
// one 16-token block.
const minSizeTokens = 16

// add folds one first token of replica id into the fit, s and its measured
// seconds: a step of stochastic gradient descent on the squared log error
// of the prediction (so that the median prediction is the median time, and
// a request measured twice as slow weighs as much as one twice as fast).
// The shared share moves only on samples with work ahead, the only ones
// whose serial and shared times differ; the scale on all. A sample whose
// waits took the whole time says nothing of the prefill and is skipped,
// as is one without a positive time.
func (f *prefillFit) add(id int32, s PrefillShape, measured float64) {
	if !(measured > 0) || math.IsInf(measured, 0) || !(s.Serial > 0) || !(s.Shared > 0) ||
		math.IsInf(s.Serial, 0) || math.IsInf(s.Shared, 0) || !(s.Waits >= 0) || s.Waits >= measured || id < 0 {
		return
	}
	for len(f.shared) <= int(id) {
		f.shared = append(f.shared, 0)
		f.size = append(f.size, 0)
		f.burst = append(f.burst, [burstBuckets]float64{})
	}
	b := min(max(s.Burst, 0), burstBuckets-1)
	scale, a := f.model(id)
	mix := ((1-a)*s.Serial + a*s.Shared) * f.sizeFactor(id, s.Tokens) * math.Exp(f.burst[id][b])
	pred := s.Waits + scale*mix
	e := min(max(math.Log(pred/measured), -maxPrefillLogError), maxPrefillLogError)
	// d log pred / d log scale = scale x mix / pred: the scale moves in
	// log space, by a fraction of itself whatever its size.
	f.scale = min(max(scale*math.Exp(-prefillStep*e*scale*mix/pred), minPrefillScale), maxPrefillScale)
	// d log pred / d shared = scale x (shared time - serial time) / pred,
	// which grows without bound as shared nears 1 on a request with much
	// work ahead and made the share swing; the relative gap of the two
	// times, at most 1, moves it steadily instead.
	f.shared[id] = min(max(a-prefillStep*e*(s.Shared-s.Serial)/max(s.Serial, s.Shared), 0), 1)
	// d log pred / d size = scale x mix x log(tokens / sizeRef) / pred.
	if s.Tokens > 0 && !math.IsInf(s.Tokens, 0) {
		grad := scale * mix / pred * math.Log(max(s.Tokens, minSizeTokens)/sizeRef)
		f.size[id] = min(max(f.size[id]-sizeStep*e*grad, -maxSizeExp), maxSizeExp)
	}
	// d log pred / d burst = scale x mix / pred, as the scale's.
	f.burst[id][b] = min(max(f.burst[id][b]-prefillStep*e*scale*mix/pred, -maxBurstLog), maxBurstLog)
	f.samples++
}

// forget returns replica id's shared share and size exponent to the
// prior's.
func (f *prefillFit) forget(id int32) {
	if id >= 0 && int(id) < len(f.shared) {
		f.shared[id], f.size[id], f.burst[id] = 0, 0, [burstBuckets]float64{}
	}
}

// ObserveFirstToken fits the prefill model to a first token of replica that
// came measured seconds after the decision whose Shape was s.
func (p *Cost) ObserveFirstToken(replica string, s PrefillShape, measured float64) {
	if id, ok := p.ids[replica]; ok {
		p.prefill.add(id, s, measured)
		p.report.add(id, s.Class, s.Modelled, measured)
	}
}

// prefillTimes returns the serial and shared prefill times, in seconds, of
// a prompt of prefill tokens behind ahead tokens of work owed to requests
// (them of them) on candidate c: each counts a decode step per batch_tokens
// chunk of the work it waits for.
func (p *Cost) prefillTimes(c *Candidate, ahead, prefill, requests float64) (serial, shared float64) {
	batch := float64(p.cfg.BatchTokens)
	work := ahead + prefill
	serial = c.DecodeStep*(1+math.Floor(work/batch)) + work/c.PrefillRate
	sharedWork := min(ahead, requests*prefill) + prefill
	shared = c.DecodeStep*(1+math.Floor(sharedWork/batch)) + sharedWork/c.PrefillRate
	return serial, shared
}

// sizeExp returns replica id's size exponent (0 before any sample).
func (f *prefillFit) sizeExp(id int32) float64 {
	if id < 0 || int(id) >= len(f.size) {
		return 0
	}
	return f.size[id]
}

// burstFactor is replica id's factor of the prefill of a request in
// bucket b of its session's burst (burstBucket), 1 before any sample.
func (f *prefillFit) burstFactor(id int32, b int) float64 {
	if id < 0 || int(id) >= len(f.burst) {
		return 1
	}
	return math.Exp(f.burst[id][min(max(b, 0), burstBuckets-1)])
}

// A request's place in its session's burst changes its time to first
// token on an engine that shares its steps among prefills, and not on one
// that prefills one prompt at a time: the burst's requests come together,
// so the first ones share their steps with those sent after them (which
// no estimate made at the decision sees), and the later ones need not wait
// for the whole prefill of those before them. On the agentic workload
// with parallel prefill (64 slots), a request whose first token had four
// more of its burst to compute beside it took 1.5x the estimate, one with
// none 0.63x; by place in the burst the estimate / measured went from
// 0.8 (second) to 1.6 (tenth). So the prefill part of the expected time to
// first token is also scaled by a factor per replica and place, fitted
// like the rest from 1 (no correction): the estimate the balancer reports
// and checks, not the score.
const (
	// burstBuckets is the places told apart: a request of a session that
	// did not come in a burst last time (or of none), the first of a
	// session that did, then its second, third, ... up to the last
	// bucket.
	burstBuckets = 10
	// maxBurstLog bounds the log of a place's factor (e^1.5, 4.5x either
	// way).
	maxBurstLog = 1.5
)

// burstBucket is the decision's place in its session's burst: 0 for a
// request without a session, or whose session's last burst was a single
// request; 1 for the first of a burst of a session whose last one had
// more; 1 + n for the one after n of its burst.
func burstBucket(d *costDecision) int {
	switch {
	case !d.hasSession:
		return 0
	case d.inBurst:
		return min(1+int(d.sess.burstCount), burstBuckets-1)
	case d.sess.burstCount > 1:
		return 1
	}
	return 0
}
