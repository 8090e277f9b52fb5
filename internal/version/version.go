// Package version says which llmlb this is: the release set at link time
// (-ldflags "-X github.com/llmlb/llmlb/internal/version.Version=v1.2.3"),
// else what the Go toolchain recorded (module version, VCS revision).
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at link time; empty means "read the build info".
var Version = ""

// Info is what `llmlb --version` prints and llmlb_build_info exports.
type Info struct {
	Version   string // v1.2.3, a module pseudo-version, or "devel"
	Revision  string // VCS commit, "" when unknown
	GoVersion string
}

// Get returns the running binary's version information.
func Get() Info {
	info := Info{Version: Version, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				info.Revision = s.Value
			}
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	return info
}

// String is "llmlb v1.2.3 (rev abc1234, go1.26.0)".
func (i Info) String() string {
	s := "llmlb " + i.Version + " ("
	if i.Revision != "" {
		r := i.Revision
		if len(r) > 12 {
			r = r[:12]
		}
		s += "rev " + r + ", "
	}
	return s + i.GoVersion + ")"
}
