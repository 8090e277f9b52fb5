package server

import (
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/proxy"
)

// recorders hands the proxy's measurements to several recorders (the
// Prometheus metrics and the dashboard).
type recorders []proxy.Recorder

func (rs recorders) Request(replica string, reason balancer.Reason, code int) {
	for _, r := range rs {
		r.Request(replica, reason, code)
	}
}

func (rs recorders) FirstByte(replica string, d time.Duration) {
	for _, r := range rs {
		r.FirstByte(replica, d)
	}
}

func (rs recorders) StreamError(replica string) {
	for _, r := range rs {
		r.StreamError(replica)
	}
}

func (rs recorders) Failover(replica string) {
	for _, r := range rs {
		r.Failover(replica)
	}
}

// QueueWait hands a flow control wait to the recorders that observe them
// (proxy.QueueRecorder).
func (rs recorders) QueueWait(priority int, waited time.Duration) {
	for _, r := range rs {
		if q, ok := r.(proxy.QueueRecorder); ok {
			q.QueueWait(priority, waited)
		}
	}
}
