// Package proccpu accounts the CPU time processes spend over a scenario:
// user + system time of every thread of a process from /proc/<pid>/stat, the
// box's busy time from /proc/stat and the load average, sampled at the start
// and the end; Diff turns two samples into CPU per process.
package proccpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Group is a name and the processes counted under it (e.g. two workers).
type Group struct {
	Name string `json:"name"`
	PIDs []int  `json:"pids"`
}

// ParseGroups reads "proxy=12,backend=13,worker=14+15": a group per name,
// its processes joined by '+'. A name given twice adds to its group.
func ParseGroups(spec string) ([]Group, error) {
	var out []Group
	idx := map[string]int{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, pids, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.TrimSpace(pids) == "" {
			return nil, fmt.Errorf("process group %q: want name=pid[+pid...]", part)
		}
		i, seen := idx[name]
		if !seen {
			i = len(out)
			idx[name] = i
			out = append(out, Group{Name: name})
		}
		for _, p := range strings.Split(pids, "+") {
			pid, err := strconv.Atoi(strings.TrimSpace(p))
			if err != nil || pid <= 0 {
				return nil, fmt.Errorf("process group %q: %q is not a process id", part, p)
			}
			out[i].PIDs = append(out[i].PIDs, pid)
		}
	}
	return out, nil
}

// Sample is the CPU state at one moment.
type Sample struct {
	At time.Time
	// Procs[i][j] is the CPU time of Groups[i].PIDs[j] so far; -1 when it
	// could not be read (the process is gone).
	Procs [][]time.Duration
	Errs  []error // per group: the first read error, nil when all read
	// Busy is the box's CPU time so far, all cores, idle and iowait left
	// out; Cores is the number of cpu lines /proc/stat had.
	Busy  time.Duration
	Cores int
	Load  [3]float64 // /proc/loadavg: 1, 5 and 15 minutes
}

// Take samples groups (and the box) now.
func Take(groups []Group) Sample {
	s := Sample{At: time.Now(), Procs: make([][]time.Duration, len(groups)), Errs: make([]error, len(groups))}
	for i, g := range groups {
		s.Procs[i] = make([]time.Duration, len(g.PIDs))
		for j, pid := range g.PIDs {
			d, err := Process(pid)
			if err != nil {
				d = -1
				if s.Errs[i] == nil {
					s.Errs[i] = err
				}
			}
			s.Procs[i][j] = d
		}
	}
	s.Busy, s.Cores, _ = Box()
	s.Load, _ = LoadAvg()
	return s
}

// Usage is the CPU one group spent between two samples.
type Usage struct {
	Group
	CPU time.Duration `json:"-"`
	// Seconds is CPU, in seconds (the JSON form).
	Seconds float64 `json:"cpu_seconds"`
	// Cores is CPU over the wall-clock window: 1.0 is one core busy.
	Cores float64 `json:"cores"`
	Err   string  `json:"error,omitempty"`
}

// Diff is the CPU of each group (and, last, of the whole box under the name
// "box") from a to b, both taken over the same groups.
func Diff(groups []Group, a, b Sample) []Usage {
	wall := b.At.Sub(a.At).Seconds()
	cores := func(d time.Duration) float64 {
		if wall <= 0 {
			return 0
		}
		return d.Seconds() / wall
	}
	out := make([]Usage, 0, len(groups)+1)
	for i, g := range groups {
		u := Usage{Group: g}
		for j := range g.PIDs {
			x, y := a.Procs[i][j], b.Procs[i][j]
			if x < 0 || y < 0 || y < x {
				if u.Err == "" {
					u.Err = fmt.Sprintf("process %d could not be read at both ends", g.PIDs[j])
					if e := firstErr(a.Errs[i], b.Errs[i]); e != nil {
						u.Err += ": " + e.Error()
					}
				}
				continue
			}
			u.CPU += y - x
		}
		u.Seconds, u.Cores = u.CPU.Seconds(), cores(u.CPU)
		out = append(out, u)
	}
	box := Usage{Group: Group{Name: "box"}, CPU: b.Busy - a.Busy}
	if a.Cores == 0 || b.Busy < a.Busy {
		box.CPU, box.Err = 0, "/proc/stat could not be read"
	}
	box.Seconds, box.Cores = box.CPU.Seconds(), cores(box.CPU)
	return append(out, box)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// Process is the CPU time (user + system, all threads, waited-for children
// not counted) process pid has spent.
func Process(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStat(raw)
}

// parseStat reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command name (field 2) is in parentheses and may itself hold
// spaces and parentheses: the fields are counted from the last ')'.
func parseStat(raw []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(raw, ')')
	if end < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(string(raw[end+1:]))
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat: utime/stime: %w", err)
	}
	return ticks(ut + st), nil
}

// Box is the box's busy CPU time (the first line of /proc/stat less idle and
// iowait) and its number of cores.
func Box() (time.Duration, int, error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	return parseProcStat(raw)
}

func parseProcStat(raw []byte) (time.Duration, int, error) {
	var busy uint64
	cores := 0
	found := false
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		if f[0] != "cpu" {
			cores++
			continue
		}
		// cpu user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already in user and nice.
		if len(f) < 8 {
			return 0, 0, fmt.Errorf("/proc/stat: cpu line has %d fields", len(f))
		}
		for i := 1; i < len(f) && i <= 8; i++ {
			n, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat: %w", err)
			}
			if i != 4 && i != 5 { // idle, iowait
				busy += n
			}
		}
		found = true
	}
	if !found {
		return 0, 0, errors.New("/proc/stat: no cpu line")
	}
	return ticks(busy), cores, nil
}

// LoadAvg reads /proc/loadavg.
func LoadAvg() ([3]float64, error) {
	var l [3]float64
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l, err
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return l, errors.New("/proc/loadavg: too short")
	}
	for i := range l {
		if l[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return l, fmt.Errorf("/proc/loadavg: %w", err)
		}
	}
	return l, nil
}

// clockTick is the unit of /proc's CPU times (USER_HZ), read from the
// auxiliary vector (AT_CLKTCK) the kernel gives every process; 100 when it
// cannot be read, which is USER_HZ on every Linux architecture in use.
var clockTick = func() time.Duration {
	hz := uint64(100)
	if raw, err := os.ReadFile("/proc/self/auxv"); err == nil {
		if v, ok := auxv(raw, 17); ok && v > 0 { // AT_CLKTCK
			hz = v
		}
	}
	return time.Second / time.Duration(hz)
}()

// auxv finds key in an auxiliary vector of native-endian 64-bit pairs.
func auxv(raw []byte, key uint64) (uint64, bool) {
	for i := 0; i+16 <= len(raw); i += 16 {
		k := binary.NativeEndian.Uint64(raw[i:])
		if k == 0 {
			break
		}
		if k == key {
			return binary.NativeEndian.Uint64(raw[i+8:]), true
		}
	}
	return 0, false
}

func ticks(n uint64) time.Duration { return time.Duration(n) * clockTick }
