// Command cdi-validate loads CDI spec files with tags.cncf.io/container-device-interface, the
// library containerd, podman and CRI-O load specs with, and says what it rejects.
//
//	cdi-validate SPEC...
//
// Each SPEC is read with cdi.ReadSpec (parse, cdiVersion, kind, device names, every device's
// container edits) and then loaded alone into a cdi.Cache over a directory of its own, as a
// runtime would find it in /var/run/cdi. Per spec one line on stdout:
//
//	OK <path> <kind> <n> <qualified device name>,...
//
// or on stderr "FAIL <path>: <the library's message>". Exit status: 0 every spec loaded,
// 1 any was rejected, 2 usage.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func check(path string) error {
	spec, err := cdi.ReadSpec(path, 0)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "cdi-validate-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), data, 0o644); err != nil {
		return err
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	var msgs []string
	for p, errs := range cache.GetErrors() {
		for _, e := range errs {
			msgs = append(msgs, fmt.Sprintf("%s: %v", p, e))
		}
	}
	if len(msgs) > 0 {
		sort.Strings(msgs)
		return fmt.Errorf("cache: %s", strings.Join(msgs, "; "))
	}
	devices := cache.ListDevices()
	if len(devices) != len(spec.Devices) {
		return fmt.Errorf("the cache lists %d devices, the spec has %d", len(devices), len(spec.Devices))
	}
	fmt.Printf("OK %s %s %d %s\n", path, spec.Kind, len(devices), strings.Join(devices, ","))
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate SPEC...")
		os.Exit(2)
	}
	status := 0
	for _, p := range os.Args[1:] {
		if err := check(p); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", p, err)
			status = 1
		}
	}
	os.Exit(status)
}
