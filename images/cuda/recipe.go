// Package cuda is the recipe of the production slice images: the small
// base image and the CUDA developer image derived from it, both from
// Ubuntu's cloud image.
//
// The base image is Ubuntu's cloud image plus the gpuaas slice contract
// (layer "gpuaas-contract"): cloud-init reads the per-allocation NoCloud
// seed, keeps root's SSH keys from it, and writes the seed's instance-id
// to /run/gpuaas/instance-id; the image's marker lives at /gpuaas/marker
// on its EFI system partition and shows as /disk/gpuaas/marker — the same
// contract the lab guest (images/guest) honours, so the agent's base
// readiness checks hold for both. It carries no driver and no toolchain.
//
// The CUDA developer image adds layer "cuda" from NVIDIA's repository:
// the open kernel driver (built by DKMS for the image's kernel), the CUDA
// toolkit, fabric manager (NVSwitch on HGX H200) and nvidia-persistenced,
// and what launchable apps need (agent/apprun): the OCI runtime crun (from
// Ubuntu) and the NVIDIA container toolkit (its prestart hook gives a
// container the slice's GPUs and driver libraries; a boot-time unit
// writes the CDI spec of the slice's GPUs for CDI-aware runtimes), every
// package pinned to an exact version and held. Its catalog kind is
// slice_cuda and its readiness check "cuda" (nvidia-smi lists the slice's
// GPUs).
//
// Recipe renders everything a build installs (apt preferences, cloud-init
// configuration, the customisation script, the manifest) as pure
// functions, tested offline. Build (build.go) runs it with qemu-img and
// virt-customize after a preflight that refuses, with a clear message,
// when NVIDIA's repository or Ubuntu's image server is unreachable.
package cuda

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Image kinds and readiness checks (proto.ImageKind values).
const (
	KindBase = "slice_base"
	KindCUDA = "slice_cuda"
)

// Layer names.
const (
	LayerContract = "gpuaas-contract"
	LayerCUDA     = "cuda"
)

// Contract paths, shared with the lab guest and the agent's checks.
const (
	InstanceIDPath = "/run/gpuaas/instance-id"
	MarkerPath     = "/gpuaas/marker" // on the ESP (/boot/efi in Ubuntu)
	DiskLink       = "/disk"          // -> /boot/efi, so the marker is /disk/gpuaas/marker
	CloudCfgPath   = "/etc/cloud/cloud.cfg.d/99-gpuaas.cfg"
	AptPrefsPath   = "/etc/apt/preferences.d/gpuaas-cuda"
	AptSourcePath  = "/etc/apt/sources.list.d/cuda.list"
	KeyringPath    = "/usr/share/keyrings/cuda-archive-keyring.gpg"
	// CDIUnitPath is the unit writing the CDI spec of the slice's GPUs
	// at boot (CDISpecPath), after the driver is up.
	CDIUnitPath = "/etc/systemd/system/gpuaas-nvidia-cdi.service"
	CDISpecPath = "/var/run/cdi/nvidia.yaml"
	// ToolkitHook is the NVIDIA container toolkit's OCI prestart hook
	// the app runner adds to a container given GPUs.
	ToolkitHook = "/usr/bin/nvidia-container-runtime-hook"
)

// Base is the Ubuntu cloud image a recipe starts from, pinned by release
// serial; its digest is checked against the release's SHA256SUMS, whose
// signature is checked against Ubuntu's cloud image key.
type Base struct {
	Release   string // "24.04"
	Codename  string // "noble"
	Serial    string // "release-20240423"
	File      string // "ubuntu-24.04-server-cloudimg-amd64.img"
	Server    string // "https://cloud-images.ubuntu.com/releases"
	KeyFinger string // fingerprint of the key signing SHA256SUMS
}

// URL is the image's address.
func (b Base) URL() string { return b.dir() + b.File }

// SumsURL is the release's SHA256SUMS (SumsURL()+".gpg" is its signature).
func (b Base) SumsURL() string { return b.dir() + "SHA256SUMS" }

func (b Base) dir() string {
	return strings.TrimSuffix(b.Server, "/") + "/" + b.Codename + "/" + b.Serial + "/"
}

// Repo is an apt repository with its signing key pinned by fingerprint.
type Repo struct {
	URL       string // ends with "/": ".../repos/ubuntu2404/x86_64/"
	Key       string // key file name under URL ("3bf863cc.pub")
	KeyFinger string // its OpenPGP fingerprint, 40 upper-case hex
}

// Package is an apt package pinned to exactly Version.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Why     string `json:"why,omitempty"`
}

// Recipe is one production slice image.
type Recipe struct {
	Name           string
	Version        string
	Kind           string
	ReadinessCheck string
	SizeGiB        int
	Base           Base
	Layers         []string
	// Repo and Packages are the CUDA layer's (empty for the base).
	Repo     *Repo
	Packages []Package
	// Services are enabled at boot.
	Services []string
}

// The pinned versions of the CUDA layer. The driver branch is the one the
// lab's simulated nvidia-smi reports (lab/guestgpu.DriverVersion).
const (
	DriverBranch  = "570"
	DriverVersion = "570.124.06"
	CUDAVersion   = "12.8.1"
	// ToolkitVersion is the NVIDIA container toolkit's (from the same
	// NVIDIA repository); CrunVersion Ubuntu 24.04's crun.
	ToolkitVersion = "1.17.5-1"
	CrunVersion    = "1.14.1-1"
)

// UbuntuBase is Ubuntu 24.04 LTS's cloud image.
var UbuntuBase = Base{
	Release: "24.04", Codename: "noble", Serial: "release-20240423",
	File:   "ubuntu-24.04-server-cloudimg-amd64.img",
	Server: "https://cloud-images.ubuntu.com/releases",
	// UEC Image Automatic Signing Key <cdimage@ubuntu.com>.
	KeyFinger: "D2EB44626FDDC30B513D5BB71A5D6C4C7DB87C81",
}

// NVIDIARepo is NVIDIA's CUDA repository for Ubuntu 24.04.
var NVIDIARepo = Repo{
	URL: "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/",
	Key: "3bf863cc.pub",
	// cudatools <cudatools@nvidia.com>, the repository key since 2022.
	KeyFinger: "EB693B3035CD5710E231E123A4B469963BF863CC",
}

// BaseRecipe is the production base slice image: Ubuntu plus the contract.
func BaseRecipe() Recipe {
	return Recipe{Name: "gpuaas-ubuntu-base", Version: UbuntuBase.Release + "-" + strings.TrimPrefix(UbuntuBase.Serial, "release-"),
		Kind: KindBase, SizeGiB: 8, Base: UbuntuBase, Layers: []string{LayerContract}}
}

// CUDARecipe is the CUDA developer image: the base plus the CUDA layer.
func CUDARecipe() Recipe {
	r := BaseRecipe()
	r.Name, r.Kind, r.ReadinessCheck, r.SizeGiB = "gpuaas-ubuntu-cuda", KindCUDA, "cuda", 32
	r.Version = r.Version + "-cuda" + CUDAVersion + "-" + DriverVersion
	r.Layers = append(r.Layers, LayerCUDA)
	repo := NVIDIARepo
	r.Repo = &repo
	drv := DriverVersion + "-0ubuntu1"
	r.Packages = []Package{
		{"nvidia-driver-" + DriverBranch + "-open", drv, "open GPU kernel modules (DKMS) and the userspace driver"},
		{"nvidia-dkms-" + DriverBranch + "-open", drv, "builds the open kernel modules for the image's kernel"},
		{"nvidia-utils-" + DriverBranch, drv, "nvidia-smi"},
		{"nvidia-compute-utils-" + DriverBranch, drv, "nvidia-persistenced"},
		{"nvidia-fabricmanager-" + DriverBranch, DriverVersion + "-1", "NVSwitch fabric manager (HGX H200)"},
		{"libnvidia-nscq-" + DriverBranch, DriverVersion + "-1", "NVSwitch configuration and query library for fabric manager"},
		{"cuda-toolkit-12-8", CUDAVersion + "-1", "CUDA toolkit (nvcc, libraries)"},
		{"crun", CrunVersion, "the OCI runtime launchable apps run with (agent/apprun)"},
		{"nvidia-container-toolkit", ToolkitVersion, "the OCI prestart hook giving an app's container its GPUs, and nvidia-ctk (CDI)"},
		{"nvidia-container-toolkit-base", ToolkitVersion, "nvidia-ctk and the toolkit's configuration"},
		{"libnvidia-container-tools", ToolkitVersion, "nvidia-container-cli, which the hook runs"},
		{"libnvidia-container1", ToolkitVersion, "the container GPU library"},
	}
	r.Services = []string{"nvidia-persistenced.service", "nvidia-fabricmanager.service", "gpuaas-nvidia-cdi.service"}
	return r
}

var (
	pkgNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]{1,62}$`)
	pkgVerRE  = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~-]{0,62}$`)
	fingerRE  = regexp.MustCompile(`^[0-9A-F]{40}$`)
	nameRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)
	wordRE    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	serviceRE = regexp.MustCompile(`^[a-z0-9][a-z0-9@._-]{0,62}\.service$`)
	fileRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// Validate checks that r is buildable as written: https sources, pinned
// keys, every package pinned to one exact version, names that cannot
// break the generated script.
func (r Recipe) Validate() error {
	if !nameRE.MatchString(r.Name) || !wordRE.MatchString(r.Version) {
		return fmt.Errorf("recipe %q version %q: want [a-z0-9.-] names", r.Name, r.Version)
	}
	if r.Kind != KindBase && r.Kind != KindCUDA {
		return fmt.Errorf("recipe %s: kind %q: want %s or %s", r.Name, r.Kind, KindBase, KindCUDA)
	}
	if r.SizeGiB < 4 || r.SizeGiB > 256 {
		return fmt.Errorf("recipe %s: %d GiB: want 4-256", r.Name, r.SizeGiB)
	}
	b := r.Base
	if err := httpsURL(b.Server); err != nil {
		return fmt.Errorf("recipe %s: base server: %w", r.Name, err)
	}
	if !wordRE.MatchString(b.Codename) || !wordRE.MatchString(b.Serial) || !fileRE.MatchString(b.File) || !fingerRE.MatchString(b.KeyFinger) {
		return fmt.Errorf("recipe %s: base image %s/%s/%s or its key %q is malformed", r.Name, b.Codename, b.Serial, b.File, b.KeyFinger)
	}
	if len(r.Layers) == 0 || r.Layers[0] != LayerContract {
		return fmt.Errorf("recipe %s: the first layer must be %s", r.Name, LayerContract)
	}
	cuda := slices.Contains(r.Layers, LayerCUDA)
	if cuda != (r.Kind == KindCUDA) {
		return fmt.Errorf("recipe %s: kind %s with layers %v: the cuda layer makes a %s image and only it", r.Name, r.Kind, r.Layers, KindCUDA)
	}
	if !cuda && (r.Repo != nil || len(r.Packages) > 0) {
		return fmt.Errorf("recipe %s: a base image takes no repository and no packages", r.Name)
	}
	if cuda {
		if r.Repo == nil || len(r.Packages) == 0 {
			return fmt.Errorf("recipe %s: the cuda layer needs NVIDIA's repository and its packages", r.Name)
		}
		if err := httpsURL(r.Repo.URL); err != nil || !strings.HasSuffix(r.Repo.URL, "/") {
			return fmt.Errorf("recipe %s: repository %q: want an https URL ending in /", r.Name, r.Repo.URL)
		}
		if !fileRE.MatchString(r.Repo.Key) || !fingerRE.MatchString(r.Repo.KeyFinger) {
			return fmt.Errorf("recipe %s: repository key %q fingerprint %q: want a file name and 40 upper-case hex", r.Name, r.Repo.Key, r.Repo.KeyFinger)
		}
		if r.ReadinessCheck != "cuda" {
			return fmt.Errorf("recipe %s: a %s image's readiness check is \"cuda\", not %q", r.Name, KindCUDA, r.ReadinessCheck)
		}
	}
	seen := map[string]bool{}
	for _, p := range r.Packages {
		if !pkgNameRE.MatchString(p.Name) {
			return fmt.Errorf("recipe %s: package name %q", r.Name, p.Name)
		}
		if !pkgVerRE.MatchString(p.Version) {
			return fmt.Errorf("recipe %s: package %s is not pinned to an exact version (%q)", r.Name, p.Name, p.Version)
		}
		if seen[p.Name] {
			return fmt.Errorf("recipe %s: package %s listed twice", r.Name, p.Name)
		}
		seen[p.Name] = true
	}
	for _, s := range r.Services {
		if !serviceRE.MatchString(s) {
			return fmt.Errorf("recipe %s: service %q", r.Name, s)
		}
	}
	return nil
}

func httpsURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: want an https URL", s)
	}
	return nil
}

// CloudConfig is the contract's cloud-init configuration (CloudCfgPath):
// NoCloud first, root keeps the seed's keys, and every boot writes the
// seed's instance-id where the readiness gate reads it.
func (r Recipe) CloudConfig() string {
	return `# gpuaas slice contract (generated by the gpuaas slice image recipe; do not edit).
# The agent's readiness gate logs in as root with the key it put in the
# NoCloud seed and reads ` + InstanceIDPath + ` and /disk` + MarkerPath + `.
datasource_list: [ NoCloud, None ]
disable_root: false
ssh_pwauth: false
bootcmd:
  - [ sh, -c, 'install -d -m 0755 /run/gpuaas && cloud-init query instance_id > ` + InstanceIDPath + `' ]
`
}

// AptPreferences pins every package of the CUDA layer to its version
// (AptPrefsPath); empty for the base.
func (r Recipe) AptPreferences() string {
	if len(r.Packages) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("# gpuaas CUDA image pins (generated by the gpuaas slice image recipe; do not edit).\n")
	for _, p := range r.Packages {
		fmt.Fprintf(&b, "\nPackage: %s\nPin: version %s\nPin-Priority: 1001\n", p.Name, p.Version)
	}
	return b.String()
}

// AptSource is the CUDA layer's sources.list line (AptSourcePath).
func (r Recipe) AptSource() string {
	if r.Repo == nil {
		return ""
	}
	return "deb [signed-by=" + KeyringPath + "] " + r.Repo.URL + " /\n"
}

// PackageArgs are the apt-get install arguments: name=version each.
func (r Recipe) PackageArgs() []string {
	var out []string
	for _, p := range r.Packages {
		out = append(out, p.Name+"="+p.Version)
	}
	return out
}

// Script is the customisation script virt-customize runs inside the
// image (network on): the contract layer, then the CUDA layer.
func (r Recipe) Script() string {
	var b strings.Builder
	b.WriteString(`#!/bin/bash
# gpuaas slice image ` + r.Name + ` ` + r.Version + ` (generated by the gpuaas slice image recipe; do not edit).
set -euxo pipefail
export DEBIAN_FRONTEND=noninteractive

# Layer ` + LayerContract + `: the marker shows as /disk` + MarkerPath + `.
test -d /boot/efi
install -d -m 0755 /boot/efi` + strings.TrimSuffix(MarkerPath, "/marker") + `
ln -sfn /boot/efi ` + DiskLink + `
cloud-init clean --logs --machine-id
`)
	if r.Repo == nil {
		return b.String()
	}
	fmt.Fprintf(&b, `
# Layer %[1]s: NVIDIA's repository, its key pinned by fingerprint.
key=$(mktemp)
curl -fsSL --retry 3 %[2]s -o "$key"
finger=$(gpg --show-keys --with-colons "$key" | awk -F: '$1=="fpr"{print $10; exit}')
if [ "$finger" != "%[3]s" ]; then
  echo "NVIDIA repository key fingerprint $finger, pinned %[3]s: refusing" >&2
  exit 1
fi
gpg --dearmor < "$key" > %[4]s
rm -f "$key"
apt-get update
kver=$(ls /lib/modules | sort -V | tail -n 1)
apt-get install -y --no-install-recommends "linux-headers-$kver"
apt-get install -y --no-install-recommends %[5]s
# The open kernel module must be built for the image's kernel, not the
# builder's.
dkms status -k "$kver" | grep -E '^nvidia/%[6]s.*: installed'
modinfo -k "$kver" -F license nvidia | grep -qx 'Dual MIT/GPL'
apt-mark hold %[7]s
for p in %[7]s; do
  test "$(dpkg-query -W -f '${Version}' "$p")" = "$(awk -v p="$p" '$1=="Package:"&&$2==p{getline;print $3}' %[8]s)"
done
# Launchables: crun runs an app's bundle; the toolkit's hook gives it the
# slice's GPUs. The CDI spec is written at boot, once the driver is up.
test -x /usr/bin/crun
test -x %[10]s
cat > %[11]s <<'UNIT'
%[12]sUNIT
systemctl enable %[9]s
apt-get clean
rm -rf /var/lib/apt/lists/*
`, LayerCUDA, r.Repo.URL+r.Repo.Key, r.Repo.KeyFinger, KeyringPath, strings.Join(r.PackageArgs(), " "),
		DriverVersion, strings.Join(r.packageNames(), " "), AptPrefsPath, strings.Join(r.Services, " "),
		ToolkitHook, CDIUnitPath, CDIUnit())
	return b.String()
}

// CDIUnit is the boot-time unit writing the CDI spec of the slice's GPUs
// (CDIUnitPath): after nvidia-persistenced, nvidia-ctk lists the GPUs the
// driver sees and their device nodes and libraries.
func CDIUnit() string {
	return `# gpuaas (generated by the gpuaas slice image recipe; do not edit).
[Unit]
Description=gpuaas: write the CDI spec of this slice's GPUs
After=nvidia-persistenced.service
Wants=nvidia-persistenced.service

[Service]
Type=oneshot
ExecStart=/usr/bin/nvidia-ctk cdi generate --output=` + CDISpecPath + `
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
`
}

func (r Recipe) packageNames() []string {
	var out []string
	for _, p := range r.Packages {
		out = append(out, p.Name)
	}
	return out
}

// Manifest describes a recipe's image; Build fills the digest fields.
type Manifest struct {
	Name           string    `json:"name"`
	Version        string    `json:"version"`
	Kind           string    `json:"kind"`
	ReadinessCheck string    `json:"readiness_check,omitempty"`
	Base           string    `json:"base"`
	Layers         []string  `json:"layers"`
	Repositories   []string  `json:"repositories,omitempty"`
	Packages       []Package `json:"packages,omitempty"`
	Services       []string  `json:"services,omitempty"`
	Files          []string  `json:"files"`
	BaseSHA256     string    `json:"base_sha256,omitempty"`
	SHA256         string    `json:"sha256,omitempty"`
	Size           int64     `json:"size,omitempty"`
	MarkerSHA256   string    `json:"marker_sha256,omitempty"`
}

// Manifest is what r puts into its image.
func (r Recipe) Manifest() Manifest {
	m := Manifest{Name: r.Name, Version: r.Version, Kind: r.Kind, ReadinessCheck: r.ReadinessCheck,
		Base: r.Base.URL(), Layers: slices.Clone(r.Layers), Packages: slices.Clone(r.Packages), Services: slices.Clone(r.Services),
		Files: []string{CloudCfgPath, "/boot/efi" + MarkerPath, DiskLink}}
	if r.Repo != nil {
		m.Repositories = []string{r.Repo.URL}
		m.Files = append(m.Files, AptSourcePath, AptPrefsPath, KeyringPath, CDIUnitPath)
	}
	return m
}
