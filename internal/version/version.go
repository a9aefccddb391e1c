// Package version names the build every binary reports (-version,
// seckill_build_info).
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at build time:
//
//	go build -ldflags "-X github.com/seckill/seckill/internal/version.Version=v1.2.3"
//
// (make build does, from git describe). Unset, it is the module version the
// Go toolchain recorded, else "dev".
var Version = ""

// Get returns the version of this build.
func Get() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// GoVersion is the toolchain the binary was built with.
func GoVersion() string { return runtime.Version() }
