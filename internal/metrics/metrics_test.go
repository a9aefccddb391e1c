package metrics

import (
	"testing"

	"github.com/seckill/seckill/internal/version"
)

func TestRegistryHasBuildInfoAndRuntimeSeries(t *testing.T) {
	mfs, err := NewRegistry("backend").Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
		if mf.GetName() != "seckill_build_info" {
			continue
		}
		if len(mf.GetMetric()) != 1 {
			t.Fatalf("seckill_build_info has %d series", len(mf.GetMetric()))
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		want := map[string]string{"component": "backend", "version": version.Get(), "goversion": version.GoVersion()}
		for k, v := range want {
			if labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, labels[k], v)
			}
		}
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("value %v, want 1", m.GetGauge().GetValue())
		}
	}
	for _, name := range []string{"seckill_build_info", "go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if !have[name] {
			t.Errorf("no %s", name)
		}
	}
}
