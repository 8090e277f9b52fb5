package simreplica

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Mode names a fault a simulated replica can be put into.
type Mode string

// The fault modes. Recover is accepted as input and means None.
const (
	None    Mode = "none"    // healthy
	Refuse  Mode = "refuse"  // listener closed: clients get ECONNREFUSED
	Hang    Mode = "hang"    // connections accepted, new requests never answered
	Error   Mode = "error"   // answer Status (default 503) at Rate (default 1)
	Slow    Mode = "slow"    // every engine step takes Factor times longer
	Break   Mode = "break"   // streams are cut (connection closed) after AfterTokens tokens
	Flap    Mode = "flap"    // refuse for half of Period, serve for the other half
	Recover Mode = "recover" // input alias of None
)

// Fault is one fault setting, as given to SetFault, `POST /sim/fault` and the
// --fault flag. Fields that do not apply to Mode are ignored and zero.
type Fault struct {
	Mode        Mode          `json:"mode"`
	Rate        float64       `json:"rate,omitempty"`         // error: fraction of requests that fail, (0,1]
	Status      int           `json:"status,omitempty"`       // error: HTTP status, 500-599
	Factor      float64       `json:"factor,omitempty"`       // slow: step-time multiplier, >= 1
	AfterTokens int           `json:"after_tokens,omitempty"` // break: tokens sent before the cut, >= 0
	Period      time.Duration `json:"-"`                      // flap: one full down+up cycle (JSON: "15s")
}

// Fault defaults applied by Normalize.
const (
	defaultErrorStatus = 503
	defaultSlowFactor  = 4
	defaultFlapPeriod  = 15 * time.Second
	minFlapPeriod      = 10 * time.Millisecond
)

// Normalize validates f, maps Recover and "" to None, fills defaults for the
// mode's parameters and zeroes the ones that do not apply.
func (f Fault) Normalize() (Fault, error) {
	switch f.Mode {
	case "", None, Recover:
		return Fault{Mode: None}, nil
	case Refuse, Hang:
		return Fault{Mode: f.Mode}, nil
	case Error:
		if f.Rate == 0 {
			f.Rate = 1
		}
		if f.Status == 0 {
			f.Status = defaultErrorStatus
		}
		if f.Rate < 0 || f.Rate > 1 {
			return Fault{}, fmt.Errorf("simreplica: fault error: rate %v not in (0,1]", f.Rate)
		}
		if f.Status < 500 || f.Status > 599 {
			return Fault{}, fmt.Errorf("simreplica: fault error: status %d not in 500-599", f.Status)
		}
		return Fault{Mode: Error, Rate: f.Rate, Status: f.Status}, nil
	case Slow:
		if f.Factor == 0 {
			f.Factor = defaultSlowFactor
		}
		if f.Factor < 1 {
			return Fault{}, fmt.Errorf("simreplica: fault slow: factor %v is below 1", f.Factor)
		}
		return Fault{Mode: Slow, Factor: f.Factor}, nil
	case Break:
		if f.AfterTokens < 0 {
			return Fault{}, fmt.Errorf("simreplica: fault break: after_tokens %d is negative", f.AfterTokens)
		}
		return Fault{Mode: Break, AfterTokens: f.AfterTokens}, nil
	case Flap:
		if f.Period == 0 {
			f.Period = defaultFlapPeriod
		}
		if f.Period < minFlapPeriod {
			return Fault{}, fmt.Errorf("simreplica: fault flap: period %v is below %v", f.Period, minFlapPeriod)
		}
		return Fault{Mode: Flap, Period: f.Period}, nil
	default:
		return Fault{}, fmt.Errorf("simreplica: unknown fault mode %q (want none, refuse, hang, error, slow, break, flap or recover)", f.Mode)
	}
}

// faultJSON is Fault's wire form: Period travels as a Go duration string.
type faultJSON struct {
	Mode        Mode    `json:"mode"`
	Rate        float64 `json:"rate,omitempty"`
	Status      int     `json:"status,omitempty"`
	Factor      float64 `json:"factor,omitempty"`
	AfterTokens int     `json:"after_tokens,omitempty"`
	Period      string  `json:"period,omitempty"`
}

// MarshalJSON writes Period as a duration string ("15s").
func (f Fault) MarshalJSON() ([]byte, error) {
	j := faultJSON{Mode: f.Mode, Rate: f.Rate, Status: f.Status, Factor: f.Factor, AfterTokens: f.AfterTokens}
	if f.Period != 0 {
		j.Period = f.Period.String()
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads Period as a duration string ("15s") or a number of seconds.
func (f *Fault) UnmarshalJSON(b []byte) error {
	var j struct {
		faultJSON
		Period json.RawMessage `json:"period"`
	}
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("simreplica: fault: %w", err)
	}
	*f = Fault{Mode: j.Mode, Rate: j.Rate, Status: j.Status, Factor: j.Factor, AfterTokens: j.AfterTokens}
	if len(j.Period) == 0 || string(j.Period) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(j.Period, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("simreplica: fault period: %w", err)
		}
		f.Period = d
		return nil
	}
	var secs float64
	if err := json.Unmarshal(j.Period, &secs); err != nil {
		return fmt.Errorf("simreplica: fault period: want a duration like \"15s\": %w", err)
	}
	f.Period = time.Duration(secs * float64(time.Second))
	return nil
}

// ParseFault reads the command-line form of a fault: MODE[:key=value,...], for
// example "refuse", "error:rate=0.5,status=503", "slow:factor=4",
// "break:after_tokens=10", "flap:period=15s". A JSON object is accepted too.
// The result is normalized.
func ParseFault(spec string) (Fault, error) {
	spec = strings.TrimSpace(spec)
	if strings.HasPrefix(spec, "{") {
		var f Fault
		if err := json.Unmarshal([]byte(spec), &f); err != nil {
			return Fault{}, err
		}
		return f.Normalize()
	}
	mode, params, _ := strings.Cut(spec, ":")
	f := Fault{Mode: Mode(strings.ToLower(strings.TrimSpace(mode)))}
	if params != "" {
		for kv := range strings.SplitSeq(params, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return Fault{}, fmt.Errorf("simreplica: fault %q: parameter %q is not key=value", spec, kv)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			var err error
			switch k {
			case "rate":
				f.Rate, err = strconv.ParseFloat(v, 64)
			case "status":
				f.Status, err = strconv.Atoi(v)
			case "factor":
				f.Factor, err = strconv.ParseFloat(v, 64)
			case "after_tokens", "after":
				f.AfterTokens, err = strconv.Atoi(v)
			case "period":
				f.Period, err = time.ParseDuration(v)
			default:
				return Fault{}, fmt.Errorf("simreplica: fault %q: unknown parameter %q", spec, k)
			}
			if err != nil {
				return Fault{}, fmt.Errorf("simreplica: fault %q: parameter %s: %w", spec, k, err)
			}
		}
	}
	return f.Normalize()
}

// String renders f in ParseFault's form.
func (f Fault) String() string {
	switch f.Mode {
	case Error:
		return fmt.Sprintf("error:rate=%g,status=%d", f.Rate, f.Status)
	case Slow:
		return fmt.Sprintf("slow:factor=%g", f.Factor)
	case Break:
		return fmt.Sprintf("break:after_tokens=%d", f.AfterTokens)
	case Flap:
		return fmt.Sprintf("flap:period=%s", f.Period)
	case "":
		return string(None)
	default:
		return string(f.Mode)
	}
}

// refusing reports whether the listener must be closed at now for a fault
// set at since: always for Refuse, during the first half of every Period for
// Flap (a flapping replica goes down at once, then comes back).
func (f Fault) refusing(since, now time.Time) bool {
	switch f.Mode {
	case Refuse:
		return true
	case Flap:
		if f.Period <= 0 {
			return false
		}
		phase := now.Sub(since) % f.Period
		if phase < 0 {
			phase += f.Period
		}
		return phase < f.Period/2
	default:
		return false
	}
}

// nextChange returns the first instant after now at which refusing changes;
// ok is false when it never does.
func (f Fault) nextChange(since, now time.Time) (time.Time, bool) {
	if f.Mode != Flap || f.Period <= 0 {
		return time.Time{}, false
	}
	half := f.Period / 2
	if half <= 0 {
		return time.Time{}, false
	}
	elapsed := now.Sub(since)
	if elapsed < 0 {
		return since, true
	}
	k := elapsed/half + 1
	return since.Add(k * half), true
}
