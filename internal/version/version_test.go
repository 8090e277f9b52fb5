package version

import (
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	old := Version
	defer func() { Version = old }()
	Version = "v1.2.3"
	i := Get()
	if i.Version != "v1.2.3" || !strings.HasPrefix(i.GoVersion, "go") {
		t.Fatalf("Get() = %+v", i)
	}
	if s := (Info{Version: "v1.2.3", Revision: "0123456789abcdef", GoVersion: "go1.26.0"}).String(); s != "llmlb v1.2.3 (rev 0123456789ab, go1.26.0)" {
		t.Errorf("String() = %q", s)
	}
	Version = ""
	if Get().Version == "" {
		t.Error("no version without a link-time one: want the build info's or \"devel\"")
	}
}
