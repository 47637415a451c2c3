package apprun

// The OCI runtime bundle's config.json (runtime-spec v1.0), written from
// the image configuration and the instance's Spec: the image's entrypoint,
// user, working directory and environment; the default container mounts;
// pid/ipc/uts/mount/cgroup namespaces; a network namespace only when the
// runner gives one (the guest runner shares the guest's, so the app's ports
// are on the guest's private address); the GPUs' device nodes; Docker's
// default capability set and masked paths.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

type rtSpec struct {
	OCIVersion string            `json:"ociVersion"`
	Process    rtProcess         `json:"process"`
	Root       rtRoot            `json:"root"`
	Hostname   string            `json:"hostname"`
	Mounts     []rtMount         `json:"mounts"`
	Hooks      *rtHooks          `json:"hooks,omitempty"`
	Linux      rtLinux           `json:"linux"`
	Annots     map[string]string `json:"annotations,omitempty"`
}

type rtProcess struct {
	Terminal     bool     `json:"terminal"`
	User         rtUser   `json:"user"`
	Args         []string `json:"args"`
	Env          []string `json:"env"`
	Cwd          string   `json:"cwd"`
	Capabilities rtCaps   `json:"capabilities"`
	// No rlimits: the process inherits the runtime's (the agent's or
	// the guest's), which a container may not raise past anyway.
	NoNewPrivileges bool `json:"noNewPrivileges"`
}

type rtUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type rtCaps struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type rtRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type rtMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type rtHooks struct {
	Prestart []rtHook `json:"prestart,omitempty"`
}

type rtHook struct {
	Path string   `json:"path"`
	Args []string `json:"args,omitempty"`
	Env  []string `json:"env,omitempty"`
}

type rtLinux struct {
	Namespaces    []rtNamespace `json:"namespaces"`
	Devices       []Device      `json:"devices,omitempty"`
	Resources     rtResources   `json:"resources"`
	MaskedPaths   []string      `json:"maskedPaths"`
	ReadonlyPaths []string      `json:"readonlyPaths"`
}

type rtNamespace struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"`
}

type rtResources struct {
	Devices []rtDeviceRule `json:"devices"`
}

type rtDeviceRule struct {
	Allow  bool   `json:"allow"`
	Type   string `json:"type,omitempty"`
	Major  *int64 `json:"major,omitempty"`
	Minor  *int64 `json:"minor,omitempty"`
	Access string `json:"access"`
}

// Device is a device node the container gets (a GPU's /dev/nvidiaN and
// the driver's control nodes).
type Device struct {
	Path     string `json:"path"`
	Type     string `json:"type"` // c | b
	Major    int64  `json:"major"`
	Minor    int64  `json:"minor"`
	FileMode uint32 `json:"fileMode"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
}

// bundleOptions are the runner's part of the runtime config.
type bundleOptions struct {
	// NetNS is the network namespace to join ("" = the runtime's own
	// host's, i.e. the guest's).
	NetNS   string
	Devices []Device
	// Hooks are prestart hooks (the NVIDIA container toolkit's).
	Hooks []rtHook
}

// defaultCaps is Docker's default capability set.
var defaultCaps = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}

var envKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// runtimeConfig builds the bundle's config.json for s from the image
// configuration ic; rootfs is the unpacked root (to resolve a user name).
func runtimeConfig(s Spec, ic ImageConfig, rootfs string, o bundleOptions) (rtSpec, error) {
	args := append(append([]string{}, ic.Config.Entrypoint...), ic.Config.Cmd...)
	if len(args) == 0 {
		return rtSpec{}, fmt.Errorf("image %s has neither Entrypoint nor Cmd", s.App.Image)
	}
	user, err := resolveUser(ic.Config.User, rootfs)
	if err != nil {
		return rtSpec{}, fmt.Errorf("image %s: %w", s.App.Image, err)
	}
	env := map[string]string{}
	var order []string
	set := func(kv string) {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	set("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	for _, kv := range ic.Config.Env {
		set(kv)
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		if !envKeyPattern.MatchString(k) {
			return rtSpec{}, fmt.Errorf("environment variable name %q is not valid", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		set(k + "=" + s.Env[k])
	}
	set("GPUAAS_INSTANCE=" + s.InstanceID)
	set("GPUAAS_ALLOCATION=" + s.AllocationID)
	envList := make([]string, 0, len(order))
	for _, k := range order {
		envList = append(envList, k+"="+env[k])
	}
	cwd := ic.Config.WorkingDir
	if cwd == "" {
		cwd = "/"
	}
	ns := []rtNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "cgroup"}}
	if o.NetNS != "" {
		ns = append(ns, rtNamespace{Type: "network", Path: o.NetNS})
	}
	sysfs := rtMount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}
	if o.NetNS == "" {
		// Without a network namespace of its own a fresh sysfs would
		// show the host's; bind the host's read-only (as Docker's
		// --network host does).
		sysfs = rtMount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
	}
	rules := []rtDeviceRule{{Allow: false, Access: "rwm"}}
	rules = append(rules, defaultDeviceRules...)
	for _, d := range o.Devices {
		maj, mnr := d.Major, d.Minor
		rules = append(rules, rtDeviceRule{Allow: true, Type: d.Type, Major: &maj, Minor: &mnr, Access: "rwm"})
	}
	spec := rtSpec{
		OCIVersion: "1.0.2",
		Process: rtProcess{
			User: user, Args: args, Env: envList, Cwd: cwd,
			Capabilities:    rtCaps{Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps},
			NoNewPrivileges: true,
		},
		Root:     rtRoot{Path: "rootfs"},
		Hostname: hostnameOf(s.InstanceID),
		Mounts: []rtMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			sysfs,
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: rtLinux{
			Namespaces: ns,
			Devices:    o.Devices,
			Resources:  rtResources{Devices: rules},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		Annots: map[string]string{"io.gpuaas.instance": s.InstanceID, "io.gpuaas.allocation": s.AllocationID,
			"io.gpuaas.app": s.App.Name + "@" + s.App.Version, "org.opencontainers.image.ref.name": s.App.Image},
	}
	if len(o.Hooks) > 0 {
		spec.Hooks = &rtHooks{Prestart: o.Hooks}
	}
	return spec, nil
}

func i64(v int64) *int64 { return &v }

// defaultDeviceRules are the device cgroup allowances every container
// gets (null, zero, full, random, urandom, tty, the pty master and slaves).
var defaultDeviceRules = []rtDeviceRule{
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(3), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(5), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(7), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(8), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(1), Minor: i64(9), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(0), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(5), Minor: i64(2), Access: "rwm"},
	{Allow: true, Type: "c", Major: i64(136), Access: "rwm"},
}

// hostnameOf is the container's hostname: the instance ID, cut to 63.
func hostnameOf(id string) string {
	h := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '-'
	}, id)
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(h, "-")
}

// resolveUser reads the image's User ("uid", "uid:gid", "name",
// "name:group"); names are looked up in the image's /etc/passwd and
// /etc/group. Empty is root.
func resolveUser(u, rootfs string) (rtUser, error) {
	if u == "" {
		return rtUser{}, nil
	}
	name, group, hasGroup := strings.Cut(u, ":")
	var out rtUser
	uid, err := strconv.ParseUint(name, 10, 32)
	if err == nil {
		out.UID = uint32(uid)
		if e, ok, _ := lookupFile(filepath.Join(rootfs, "etc", "passwd"), func(f []string) bool { return f[2] == name }); ok && len(e) > 3 {
			if g, err := strconv.ParseUint(e[3], 10, 32); err == nil {
				out.GID = uint32(g)
			}
		}
	} else {
		e, ok, lerr := lookupFile(filepath.Join(rootfs, "etc", "passwd"), func(f []string) bool { return f[0] == name })
		if lerr != nil || !ok || len(e) < 4 {
			return rtUser{}, fmt.Errorf("user %q is not in the image's /etc/passwd", name)
		}
		uid, err1 := strconv.ParseUint(e[2], 10, 32)
		gid, err2 := strconv.ParseUint(e[3], 10, 32)
		if err1 != nil || err2 != nil {
			return rtUser{}, fmt.Errorf("user %q: bad /etc/passwd entry", name)
		}
		out.UID, out.GID = uint32(uid), uint32(gid)
	}
	if hasGroup {
		if g, err := strconv.ParseUint(group, 10, 32); err == nil {
			out.GID = uint32(g)
		} else {
			e, ok, lerr := lookupFile(filepath.Join(rootfs, "etc", "group"), func(f []string) bool { return f[0] == group })
			if lerr != nil || !ok || len(e) < 3 {
				return rtUser{}, fmt.Errorf("group %q is not in the image's /etc/group", group)
			}
			g, err := strconv.ParseUint(e[2], 10, 32)
			if err != nil {
				return rtUser{}, fmt.Errorf("group %q: bad /etc/group entry", group)
			}
			out.GID = uint32(g)
		}
	}
	return out, nil
}

// lookupFile returns the first colon-separated line of a passwd-style
// file that match accepts (a line needs at least 3 fields).
func lookupFile(p string, match func([]string) bool) ([]string, bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && match(fields) {
			return fields, true, nil
		}
	}
	return nil, false, sc.Err()
}
