package main

import (
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"strings"
)

// Garbage collector defaults of `llmlb serve` (docs/OPERATIONS.md "Garbage
// collector"). The proxy allocates ~30 KB a request and keeps a small live
// heap, so at Go's GOGC=100 it collects tens of times a second under load;
// GOGC=400 collects a quarter as often (issue 14: ~10% less CPU a JSON
// request, BENCHMARKS.md). A higher GOGC lets the heap grow to 5x the live
// heap instead of 2x, so it is applied only where that growth is bounded: a
// soft memory limit is set (GOMEMLIMIT), or can be set from the process's
// cgroup memory limit (a container's, systemd's MemoryMax).
const (
	serveGCPercent = 400
	// memLimitShare of the cgroup's limit becomes the soft memory limit,
	// leaving the rest to what the Go heap does not count (stacks, the
	// runtime, the kernel's socket buffers charged to the cgroup).
	memLimitShare = 0.9
)

// gcPlan is what tuneGC changes: a GC percent (0: leave it) and a soft
// memory limit (0: leave it).
type gcPlan struct {
	percent int
	limit   int64
}

// planGC decides the GC settings from the environment and the cgroup
// memory limit (0: none known). The operator's GOGC wins outright; with
// GOMEMLIMIT set, only the percent is raised; with neither, the percent is
// raised only if a cgroup limit bounds the heap.
func planGC(getenv func(string) string, cgroupLimit int64) gcPlan {
	switch {
	case getenv("GOGC") != "":
		return gcPlan{}
	case getenv("GOMEMLIMIT") != "":
		return gcPlan{percent: serveGCPercent}
	case cgroupLimit > 0:
		return gcPlan{percent: serveGCPercent, limit: int64(float64(cgroupLimit) * memLimitShare)}
	}
	return gcPlan{}
}

// tuneGC applies planGC's settings to the running process and returns them.
func tuneGC() gcPlan {
	plan := planGC(os.Getenv, cgroupMemoryLimit(os.ReadFile))
	if plan.limit > 0 {
		debug.SetMemoryLimit(plan.limit)
	}
	if plan.percent > 0 {
		debug.SetGCPercent(plan.percent)
	}
	return plan
}

// unlimited is where cgroup v1 reports "no limit" (a page-rounded 2^63-1).
const unlimited = 1 << 60

// cgroupMemoryLimit returns the memory limit of the process's cgroup in
// bytes, 0 when there is none or it cannot be read: cgroup v2's memory.max,
// else cgroup v1's memory.limit_in_bytes, at the process's cgroup path
// (/proc/self/cgroup) or at the mount's root (a container's own cgroup
// namespace shows its cgroup there).
func cgroupMemoryLimit(readFile func(string) ([]byte, error)) int64 {
	self, err := readFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	var candidates []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(self)), "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			candidates = append(candidates, path.Join("/sys/fs/cgroup", parts[2], "memory.max"), "/sys/fs/cgroup/memory.max")
		case hasController(parts[1], "memory"):
			candidates = append(candidates, path.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes"),
				"/sys/fs/cgroup/memory/memory.limit_in_bytes")
		}
	}
	for _, file := range candidates {
		b, err := readFile(file)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			return 0
		}
		return n
	}
	return 0
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}
