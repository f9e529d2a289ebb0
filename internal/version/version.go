// Package version is airlock's one version string, set at build time:
//
//	go build -ldflags "-X github.com/airlockhq/airlock/internal/version.Version=v1.2.0" ./cmd/airlock
//
// (make build and make release do this from git describe). `airlock version`, the
// served openapi.json, the readiness log line and /metrics' airlock_build_info all show it.
package version

import "runtime/debug"

// Version is stamped by -ldflags; empty in a plain go build or go run.
var Version = ""

// String is Version, else the module version go install recorded, else "devel" with the
// VCS revision when the build recorded one (devel-1a2b3c4d5e6f, -dirty if modified).
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	s, dirty := "devel", false
	for _, kv := range bi.Settings {
		switch {
		case kv.Key == "vcs.revision" && len(kv.Value) >= 12:
			s += "-" + kv.Value[:12]
		case kv.Key == "vcs.modified" && kv.Value == "true":
			dirty = true
		}
	}
	if dirty {
		s += "-dirty"
	}
	return s
}
