package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU accounting for the benchmarks (scripts/bench-cpu.sh): user+sys time read from
// /proc, so a figure is the CPU a process (and, for PostgreSQL, its whole cluster) spent,
// whatever else shares the machine. Linux only; elsewhere the flags that ask for it fail.

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every Linux
// architecture Go supports (the kernel's ABI fixes it, whatever CONFIG_HZ is).
const clockTicks = 100

// procStat is a process's own user+sys time and that of the children it has reaped.
type procStat struct {
	self, reaped time.Duration
}

func readProcStat(pid int) (procStat, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may hold spaces: fields follow the last ')'.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(raw[i+1:]))
	// After the name: state(3) ppid … utime(14) stime(15) cutime(16) cstime(17).
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	var t [4]int64
	for k := range t {
		if t[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	tick := time.Second / clockTicks
	return procStat{self: time.Duration(t[0]+t[1]) * tick, reaped: time.Duration(t[2]+t[3]) * tick}, nil
}

// processCPU is pid's own user+sys time.
func processCPU(pid int) (time.Duration, error) {
	s, err := readProcStat(pid)
	return s.self, err
}

// clusterCPU is the CPU of a process tree such as a PostgreSQL cluster: the root's own
// time, the time of the children it has reaped, and that of its live descendants. A
// backend that exits between two samples moves from "live" to "reaped" with its whole
// time, so the difference of two samples is exact.
func clusterCPU(root int) (time.Duration, error) {
	s, err := readProcStat(root)
	if err != nil {
		return 0, err
	}
	total := s.self + s.reaped
	for _, c := range liveChildren(root) {
		if d, err := clusterCPU(c); err == nil { // a child may exit meanwhile: then it is reaped
			total += d
		}
	}
	return total, nil
}

func liveChildren(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var out []int
	for _, t := range tasks {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(raw)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// cpuMeter samples a PostgreSQL cluster (by its postmaster's pid) and some processes.
type cpuMeter struct {
	pg    int   // postmaster pid; 0: not measured
	pids  []int // processes measured (their own time)
	pg0   time.Duration
	proc0 time.Duration
}

func (m *cpuMeter) enabled() bool { return m.pg > 0 }

func (m *cpuMeter) sample() (pg, proc time.Duration, err error) {
	if pg, err = clusterCPU(m.pg); err != nil {
		return 0, 0, fmt.Errorf("cpu: postmaster %d: %w", m.pg, err)
	}
	for _, p := range m.pids {
		d, err := processCPU(p)
		if err != nil {
			return 0, 0, fmt.Errorf("cpu: process %d: %w", p, err)
		}
		proc += d
	}
	return pg, proc, nil
}

// start takes the "before" sample.
func (m *cpuMeter) start() error {
	var err error
	m.pg0, m.proc0, err = m.sample()
	return err
}

// result is the "after" sample as key=value fields (seconds, and µs per operation).
func (m *cpuMeter) result(ops int) (string, error) {
	pg, proc, err := m.sample()
	if err != nil {
		return "", err
	}
	dpg, dproc := pg-m.pg0, proc-m.proc0
	per := func(d time.Duration) float64 {
		if ops <= 0 {
			return 0
		}
		return float64(d.Microseconds()) / float64(ops)
	}
	return fmt.Sprintf("cpu_process_s=%.2f cpu_pg_s=%.2f cpu_us_per_op=%.0f cpu_pg_us_per_op=%.0f cpu_process_us_per_op=%.0f",
		dproc.Seconds(), dpg.Seconds(), per(dproc+dpg), per(dpg), per(dproc)), nil
}

// readPids reads whitespace-separated pids from a file.
func readPids(path string) ([]int, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(string(raw)) {
		p, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not a pid", path, f)
		}
		out = append(out, p)
	}
	return out, nil
}
