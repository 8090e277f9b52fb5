package main

import (
	"errors"
	"io/fs"
	"testing"
)

func TestPlanGC(t *testing.T) {
	for _, c := range []struct {
		name   string
		env    map[string]string
		cgroup int64
		want   gcPlan
	}{
		{"nothing set, no cgroup limit: Go's defaults", nil, 0, gcPlan{}},
		{"cgroup limit: GOGC 400 under 90% of it", nil, 1 << 30, gcPlan{percent: 400, limit: 966367641}},
		{"operator's GOMEMLIMIT: GOGC 400 under it", map[string]string{"GOMEMLIMIT": "512MiB"}, 1 << 30, gcPlan{percent: 400}},
		{"operator's GOGC: nothing changed", map[string]string{"GOGC": "100"}, 1 << 30, gcPlan{}},
		{"operator's GOGC=off with GOMEMLIMIT: nothing changed", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, 0, gcPlan{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := planGC(func(k string) string { return c.env[k] }, c.cgroup)
			if got != c.want {
				t.Fatalf("planGC = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestCgroupMemoryLimit(t *testing.T) {
	for _, c := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v2 at the process's path", map[string]string{
			"/proc/self/cgroup": "0::/system.slice/llmlb.service\n",
			"/sys/fs/cgroup/system.slice/llmlb.service/memory.max": "1073741824\n",
		}, 1 << 30},
		{"v2 in a container's namespace", map[string]string{
			"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "536870912\n",
		}, 1 << 29},
		{"v2 unlimited", map[string]string{"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n"}, 0},
		{"v1 limit", map[string]string{
			"/proc/self/cgroup": "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n",
			"/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "268435456\n",
		}, 1 << 28},
		{"v1 path not mounted there: the mount's root", map[string]string{
			"/proc/self/cgroup": "4:memory:/docker/abc\n", "/sys/fs/cgroup/memory/memory.limit_in_bytes": "268435456",
		}, 1 << 28},
		{"v1 unlimited", map[string]string{
			"/proc/self/cgroup": "4:memory:/\n", "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
		}, 0},
		{"no cgroup file", map[string]string{}, 0},
		{"garbage", map[string]string{"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "lots"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			read := func(name string) ([]byte, error) {
				if s, ok := c.files[name]; ok {
					return []byte(s), nil
				}
				return nil, errors.Join(fs.ErrNotExist, errors.New(name))
			}
			if got := cgroupMemoryLimit(read); got != c.want {
				t.Fatalf("cgroupMemoryLimit = %d, want %d", got, c.want)
			}
		})
	}
}
