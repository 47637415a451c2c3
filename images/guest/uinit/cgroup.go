package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// The app runner's OCI runtime (crun) wants the unified cgroup hierarchy.
// u-root's init mounts the cgroup v1 controllers on a tmpfs at
// /sys/fs/cgroup; this step unmounts them (nothing is in them yet, so the
// kernel frees the controllers) and mounts cgroup2 there instead, with
// every controller it offers enabled for children.

const cgroupRoot = "/sys/fs/cgroup"

func mountCgroup2() error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	mounts, err := mountsUnder(cgroupRoot)
	if err != nil {
		return err
	}
	// Deepest first, the tmpfs itself last.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	if err := os.MkdirAll(cgroupRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("cgroup2", cgroupRoot, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "nsdelegate"); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	ctrl, err := os.ReadFile(cgroupRoot + "/cgroup.controllers")
	if err != nil {
		return err
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrl)) {
		enable = append(enable, "+"+c)
	}
	if len(enable) > 0 {
		if err := os.WriteFile(cgroupRoot+"/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
			return fmt.Errorf("enable cgroup controllers %v: %w", enable, err)
		}
	}
	return nil
}

// mountsUnder lists the mount points at or below dir (/proc/self/mounts).
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && (fields[1] == dir || strings.HasPrefix(fields[1], dir+"/")) {
			out = append(out, fields[1])
		}
	}
	return out, sc.Err()
}
