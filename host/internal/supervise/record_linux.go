//go:build linux

package supervise

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// readProc reads what /proc says about pid. A process that cannot be seen
// (gone, or hidden from us) has Exists false.
func readProc(pid int) procInfo {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procInfo{}
	}
	state, started, ok := parseStat(stat)
	if !ok {
		return procInfo{}
	}
	p := procInfo{Exists: true, Zombie: state == 'Z' || state == 'X', Started: started}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		for _, a := range bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0}) {
			p.Args = append(p.Args, string(a))
		}
	}
	return p
}

// parseStat returns the state (field 3) and start time (field 22) of a
// /proc/PID/stat line. The command name (field 2) is in parentheses and
// may itself hold spaces and parentheses, so fields are counted from the
// last ')'.
func parseStat(stat []byte) (state byte, started uint64, ok bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	started, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], started, true
}

// procStartTicks returns pid's start time (/proc/PID/stat field 22).
func procStartTicks(pid int) (uint64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, started, ok := parseStat(stat)
	if !ok {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return started, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat field
// 22: 100 on every Linux architecture Go supports.
const clockTicks = 100

// procStartTime converts a start time in clock ticks since boot to wall
// time, using /proc/uptime.
func procStartTime(ticks uint64) (time.Time, bool) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return time.Time{}, false
	}
	up, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return time.Time{}, false
	}
	age := time.Duration(up*float64(time.Second)) - time.Duration(ticks)*time.Second/clockTicks
	return time.Now().Add(-age), true
}
