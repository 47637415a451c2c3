// Command nvidia-smi is the lab CUDA guest's stand-in for NVIDIA's tool:
// it lists the GPUs the lab host announced through QEMU fw_cfg
// (/sys/firmware/qemu_fw_cfg/by_name/opt/gpuaas/gpu*/raw) and answers
// `nvidia-smi`, `nvidia-smi -L` and `nvidia-smi --query-gpu=... --format=csv`
// with the real tool's output, messages and exit codes (package
// lab/guestgpu). The images/guest "cuda" variant builds it into the
// guest's u-root initramfs.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/gpuaas/gpuaas/lab/guestgpu"
)

func main() {
	inv, msg, code := guestgpu.ParseArgs(os.Args[1:])
	if code != guestgpu.ExitOK {
		fmt.Fprintln(os.Stdout, msg)
		os.Exit(code)
	}
	sysfs := guestgpu.SysfsDir
	if d := os.Getenv(guestgpu.SysfsEnv); d != "" { // tests point it at a tree of their own
		sysfs = d
	}
	gpus, err := guestgpu.Read(sysfs)
	os.Exit(guestgpu.Run(inv, gpus, err, time.Now(), os.Stdout, os.Stderr))
}
