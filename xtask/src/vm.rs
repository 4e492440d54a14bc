//! `cargo xtask vm`: run one command as root under another Debian kernel, in a qemu VM whose root
//! filesystem is this machine's own `/` (read-write, through virtiofs), so that the tracer can be
//! tried against older and newer kernels without building images.
//!
//! How it works: the kernel comes from a Debian package (`apt-get download`, `dpkg-deb -x`) and
//! boots a tiny busybox initramfs whose `/init` loads the virtio and virtiofs modules (6.1's cloud
//! kernel builds them as modules, 6.12's has them built in), mounts the host's `/` on `/mnt`, mounts
//! proc, sys, dev, tracefs, debugfs, bpffs and cgroup2 inside it, and chroots into it to run a script
//! this module generates under `target/vm/run-*/` (the environment, the working directory, the
//! command). The command's stdout and stderr go to files in that same directory, which the host
//! tails live; its exit code to another file; then the guest powers off. The kernel console goes
//! to `console.log` there, shown only if the command never ran. Both the kernel and the initramfs
//! are cached under `target/vm/kernels/<package>/`.
//!
//! Measured on the machine this was written on: KVM there is nested ("kvm-pvm") and unusable
//! (`-cpu host` fails to set MSR 0x10a, other CPU models stop with "KVM internal error"), so the
//! VM runs on TCG (`-accel tcg,thread=single -cpu max,la57=off`); boot, a short command and power-off take
//! 6-13 s. Neither kernel has 9p, hence virtiofs, which needs shared guest memory (a memfd backend
//! the size of `-m`) and `virtiofsd` running as root.

use std::{
    fs::{self, File},
    io::{Read as _, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::run_checked;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kernel {
    /// Debian 12's own kernel.
    #[value(name = "6.1")]
    V6_1,
    /// The 6.12 LTS kernel Debian 12 ships as an update.
    #[value(name = "6.12")]
    V6_12,
    /// No VM: run the command directly, so that callers can loop over kernels uniformly.
    Host,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::V6_1 => "6.1",
            Kernel::V6_12 => "6.12",
            Kernel::Host => "host",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum)]
    pub kernel: Kernel,
    /// Guest memory (qemu's `-m` syntax).
    #[arg(long, default_value = "4G")]
    pub mem: String,
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Stop the VM and fail after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// Host packages: qemu, `virtiofsd` (in `qemu-system-common` on Debian 12), and what the
/// initramfs is made of.
const PACKAGES: &[&str] = &["qemu-system-x86", "qemu-system-common", "busybox-static", "cpio"];
const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";

/// In load order. Those a kernel has built in are not in its package and are skipped. After the
/// virtio and virtiofs drivers, what the multi-host tests' network namespaces need (a bridge and
/// veth pairs): the host's `modprobe` in the chroot finds only the host kernel's modules.
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "fuse",
    "virtiofs",
    "llc",
    "stp",
    "bridge",
    "veth",
];

/// The initramfs's `/init`. `xtask_run` (the run directory, a host path) comes from the kernel
/// command line: the initramfs is cached per kernel, so nothing per run may be baked into it.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
die() { echo "xtask vm: $*"; poweroff -f; }
for m in MODULES; do
    [ -f /modules/$m.ko ] && { insmod /modules/$m.ko || die "cannot load $m"; }
done
mount -t virtiofs hostroot /mnt || die "cannot mount the host's root (virtiofs)"
cd /mnt
mount -t proc proc proc
mount -t sysfs sys sys
mount -t devtmpfs dev dev
mkdir -p dev/pts dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts dev/pts
mount -t tmpfs shm dev/shm
# The host's /run holds its daemons' state; /tmp stays the host's, commands may pass files there.
mount -t tmpfs run run
mount -t tracefs tracefs sys/kernel/tracing
mount -t debugfs debugfs sys/kernel/debug
mount -t bpf bpf sys/fs/bpf
mount -t cgroup2 cgroup2 sys/fs/cgroup
ip link set lo up
R="/mnt$xtask_run"
hostname -F "$R/hostname"
cd /
env -i /bin/busybox chroot /mnt /bin/sh "$xtask_run/command.sh" </dev/null >>"$R/stdout" 2>>"$R/stderr"
echo $? >"$R/exit.tmp" && mv "$R/exit.tmp" "$R/exit"
sync
poweroff -f
"#;

/// Environment variables passed into the guest (the guest's init starts with an empty one).
const ENV: &[&str] =
    &["PATH", "HOME", "USER", "LOGNAME", "TERM", "LANG", "LC_ALL", "TZ", "CARGO", "RUSTC_BOOTSTRAP", "ROTEL_AGENT"];
const ENV_PREFIXES: &[&str] = &["TRACER_", "CARGO_", "RUST_", "RUSTUP_"];

pub fn run(args: Args) -> Result<()> {
    std::process::exit(run_command(&args)?);
}

/// Runs the command under its kernel; returns its exit code.
pub fn run_command(args: &Args) -> Result<i32> {
    let Some((kernel_pkg, pattern)) = package(args.kernel) else {
        let status = Command::new(&args.command[0])
            .args(&args.command[1..])
            .status()
            .with_context(|| format!("cannot run {}", args.command[0]))?;
        return Ok(status.code().unwrap_or(1));
    };
    if !crate::is_root() {
        bail!("`cargo xtask vm` installs packages and runs virtiofsd over `/`: run it as root");
    }
    install_packages()?;
    let kernel = unpack_kernel(kernel_pkg, pattern)?;
    let initramfs = initramfs(&kernel)?;
    let vmlinuz = find(&kernel.join("boot"), &|p| file_name(p).starts_with("vmlinuz-"))?
        .with_context(|| format!("no vmlinuz in {}", kernel.display()))?;
    boot(args, &vmlinuz, &initramfs)
}

/// The kernel's package name, and a pattern to find its newest build should Debian have dropped it.
fn package(kernel: Kernel) -> Option<(&'static str, &'static str)> {
    match kernel {
        Kernel::V6_1 => Some(("linux-image-6.1.0-57-cloud-amd64", r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64$")),
        Kernel::V6_12 => Some((
            "linux-image-6.12.113+deb12-cloud-amd64-unsigned",
            r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
        )),
        Kernel::Host => None,
    }
}

fn vm_dir() -> PathBuf {
    crate::root().join("target/vm")
}

fn apt_get() -> Command {
    let mut c = Command::new("apt-get");
    // Waits for a concurrent `cargo xtask setup` instead of failing on the dpkg lock.
    c.args(["-q", "-o", "DPkg::Lock::Timeout=600"]).env("DEBIAN_FRONTEND", "noninteractive");
    c
}

fn install_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        println!("xtask: installing {}", missing.join(" "));
        run_checked(apt_get().arg("update"))?;
        run_checked(apt_get().args(["install", "-y", "--no-install-recommends"]).args(&missing))?;
    }
    if !Path::new(VIRTIOFSD).exists() {
        bail!("{VIRTIOFSD} is missing although {} are installed", PACKAGES.join(" "));
    }
    Ok(())
}

/// Like `toolchain`'s: whether dpkg has this package installed.
fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Downloads and unpacks the kernel package once; returns the directory it was unpacked into.
/// `apt-get update` runs only when apt's lists know no such package or their `.deb` is gone.
fn unpack_kernel(wanted: &str, pattern: &str) -> Result<PathBuf> {
    let kernels = vm_dir().join("kernels");
    if kernels.join(wanted).is_dir() {
        return Ok(kernels.join(wanted));
    }
    let resolve = || -> Result<Option<String>> {
        if Command::new("apt-cache").args(["show", wanted]).output().is_ok_and(|o| o.status.success()) {
            return Ok(Some(wanted.to_string()));
        }
        newest_package(pattern)
    };
    // Per-process names: two first runs at once must not unpack over each other.
    let tmp = kernels.join(format!(".download-{}", std::process::id()));
    let mut updated = false;
    let name = loop {
        let Some(name) = resolve()? else {
            if updated {
                bail!("apt knows no package like {wanted}");
            }
            run_checked(apt_get().arg("update"))?;
            updated = true;
            continue;
        };
        if name != wanted {
            println!("xtask: {wanted} is no longer in Debian's archive; using {name}");
        }
        if kernels.join(&name).is_dir() {
            return Ok(kernels.join(&name));
        }
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)?;
        println!("xtask: downloading {name}");
        // `_apt` cannot write into target/; without this apt warns that it downloads unsandboxed.
        let download = apt_get().current_dir(&tmp).args(["-o", "APT::Sandbox::User=root", "download", &name]).status();
        if download.is_ok_and(|s| s.success()) {
            break name;
        }
        if updated {
            bail!("apt-get download {name} failed");
        }
        run_checked(apt_get().arg("update"))?;
        updated = true;
    };
    let deb = find(&tmp, &|p| p.extension().is_some_and(|e| e == "deb"))?.context("apt-get download left no .deb")?;
    let unpacked = tmp.join("root");
    run_checked(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    let dir = kernels.join(&name);
    if fs::rename(&unpacked, &dir).is_err() && !dir.is_dir() {
        bail!("cannot move the unpacked kernel to {}", dir.display());
    }
    fs::remove_dir_all(&tmp)?;
    Ok(dir)
}

/// The newest package whose name matches `pattern`, comparing the numbers in the names.
fn newest_package(pattern: &str) -> Result<Option<String>> {
    let out = Command::new("apt-cache").args(["search", "--names-only", pattern]).output()?;
    let numbers =
        |name: &str| -> Vec<u64> { name.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect() };
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(' ').next())
        .max_by_key(|name| numbers(name))
        .map(str::to_string))
}

/// Builds the initramfs of an unpacked kernel once. Its name carries a hash of what goes into it,
/// so that changing `/init` here rebuilds it.
fn initramfs(kernel: &Path) -> Result<PathBuf> {
    use std::hash::{DefaultHasher, Hash as _, Hasher as _};
    let init = INIT.replace("MODULES", &MODULES.join(" "));
    let mut hash = DefaultHasher::new();
    init.hash(&mut hash);
    let image = kernel.join(format!("initramfs-{:016x}.cpio.gz", hash.finish()));
    if image.exists() {
        return Ok(image);
    }
    let stage = kernel.join(format!(".initramfs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&stage);
    for d in ["bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "mnt", "modules"] {
        fs::create_dir_all(stage.join(d))?;
    }
    fs::copy("/bin/busybox", stage.join("bin/busybox")).context("busybox-static is not installed")?;
    write_executable(&stage.join("init"), &init)?;
    let modules = kernel.join("lib/modules");
    for m in MODULES {
        let Some(ko) = find(&modules, &|p| [".ko", ".ko.xz"].iter().any(|e| file_name(p) == format!("{m}{e}")))? else {
            continue;
        };
        let dest = stage.join(format!("modules/{m}.ko"));
        if ko.extension().is_some_and(|e| e == "xz") {
            // busybox's insmod may not read compressed modules.
            let out = Command::new("xz").arg("-dc").arg(&ko).output()?;
            if !out.status.success() {
                bail!("cannot decompress {}", ko.display());
            }
            fs::write(&dest, out.stdout)?;
        } else {
            fs::copy(&ko, &dest)?;
        }
    }
    let tmp = image.with_extension("tmp");
    run_checked(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&tmp)
            .current_dir(&stage),
    )?;
    fs::rename(&tmp, &image)?;
    fs::remove_dir_all(&stage)?;
    Ok(image)
}

/// Boots the VM, streams the command's output, and returns its exit code.
fn boot(args: &Args, vmlinuz: &Path, initramfs: &Path) -> Result<i32> {
    let run = unique_run_dir()?;
    let run_str = run.to_str().context("target/ is not UTF-8")?;
    if run_str.contains(char::is_whitespace) {
        bail!("the run directory {run_str} goes on the kernel command line and must not contain spaces");
    }
    let cwd = std::env::current_dir()?;
    write_executable(&run.join("command.sh"), &command_script(&cwd, &args.command)?)?;
    fs::write(run.join("hostname"), fs::read_to_string("/proc/sys/kernel/hostname")?)?;
    for f in ["stdout", "stderr"] {
        File::create(run.join(f))?;
    }

    let socket = run.join("vfs.sock");
    let virtiofsd_log = File::create(run.join("virtiofsd.log"))?;
    let mut virtiofsd = Command::new(VIRTIOFSD)
        // fuse's option parser: only `--opt=value` works.
        .arg(format!("--socket-path={}", socket.display()))
        .args(["-o", "source=/", "-o", "sandbox=chroot", "-o", "cache=always"])
        .stdin(Stdio::null())
        .stdout(virtiofsd_log.try_clone()?)
        .stderr(virtiofsd_log)
        .spawn()
        .context("cannot start virtiofsd")?;
    let virtiofsd_guard = KillOnDrop(&mut virtiofsd);
    let started = Instant::now();
    while !socket.exists() {
        if virtiofsd_guard.0.try_wait()?.is_some() || started.elapsed() > Duration::from_secs(10) {
            bail!("virtiofsd did not create its socket; see {}/virtiofsd.log", run.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mem = &args.mem;
    let qemu_log = File::create(run.join("qemu.log"))?;
    let mut qemu = Command::new("qemu-system-x86_64")
        // `la57=off`: with 5-level paging (`-cpu max` has it), 6.1 puts the uprobe single-step area
        // at 0x00ffffffffffe000, above 47 bits, and a Go program whose `ret` probe is being
        // stepped there when a signal comes faults (seen in go.rs's deep-recursion test).
        // `thread=single`: one host thread runs every vCPU in turn. With one thread per vCPU, the
        // guest kernel's live code patching (`text_poke_bp`, when a tracepoint is switched on)
        // raced on 6.12 and ended in an "Oops: int3" panic in `syscall_trace_enter`; and callers
        // run several VMs side by side instead.
        .args(["-accel", "tcg,thread=single", "-cpu", "max,la57=off", "-smp", &args.cpus.to_string(), "-m", mem])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", run.join("console.log").display()))
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        // `quiet`, not `loglevel=0`: the console goes to a file, and panics must still reach it.
        .args(["-append", &format!("console=ttyS0 quiet panic=-1 rdinit=/init xtask_run={run_str}")])
        .args(["-object", &format!("memory-backend-memfd,id=mem,size={mem},share=on"), "-numa", "node,memdev=mem"])
        .arg("-chardev")
        .arg(format!("socket,id=vfs,path={}", socket.display()))
        .args(["-device", "vhost-user-fs-pci,chardev=vfs,tag=hostroot"])
        .stdin(Stdio::null())
        .stdout(qemu_log.try_clone()?)
        .stderr(qemu_log)
        .spawn()
        .context("cannot start qemu-system-x86_64")?;
    // Also when streaming fails (say, our stdout is a closed pipe): no VM may outlive us.
    let qemu = KillOnDrop(&mut qemu);

    let mut out = Tail { file: File::open(run.join("stdout"))?, to: Box::new(std::io::stdout()) };
    let mut err = Tail { file: File::open(run.join("stderr"))?, to: Box::new(std::io::stderr()) };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let status = loop {
        out.pump()?;
        err.pump()?;
        if let Some(status) = qemu.0.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            drop(qemu);
            bail!(
                "the command did not finish within {} s; the VM was stopped (its files are in {})",
                args.timeout,
                run.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    out.pump()?;
    err.pump()?;

    let Some(code) = fs::read_to_string(run.join("exit")).ok().and_then(|s| s.trim().parse().ok()) else {
        let console = fs::read_to_string(run.join("console.log")).unwrap_or_default();
        let qemu_log = fs::read_to_string(run.join("qemu.log")).unwrap_or_default();
        let tail: Vec<&str> = console.lines().chain(qemu_log.lines()).collect();
        eprintln!("{}", tail[tail.len().saturating_sub(40)..].join("\n"));
        bail!("the VM stopped ({status}) without running the command; its console and logs are in {}", run.display());
    };
    drop(virtiofsd_guard);
    fs::remove_dir_all(&run)?;
    Ok(code)
}

/// A directory of its own per run, so that concurrent runs share nothing (sockets included).
fn unique_run_dir() -> Result<PathBuf> {
    let base = vm_dir();
    fs::create_dir_all(&base)?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.subsec_nanos();
    for n in 0.. {
        let dir = base.join(format!("run-{}-{nanos:x}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).context("cannot create a run directory in target/vm"),
        }
    }
    unreachable!()
}

/// The script the guest runs in the chroot: the environment is spelled out in it, because the
/// guest's init starts with the kernel's, not ours.
fn command_script(cwd: &Path, command: &[String]) -> Result<String> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let mut script = String::from("# Generated by `cargo xtask vm`.\n");
    for (name, value) in std::env::vars_os() {
        let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else { continue };
        let wanted = ENV.contains(&name) || ENV_PREFIXES.iter().any(|p| name.starts_with(p));
        let valid = name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.starts_with(char::is_numeric);
        if wanted && valid {
            script += &format!("export {name}={}\n", quote(value));
        }
    }
    let cwd = cwd.to_str().context("the working directory is not UTF-8")?;
    script += &format!("cd {} || exit 125\n", quote(cwd));
    script += "exec";
    for arg in command {
        script += " ";
        script += &quote(arg);
    }
    script += "\n";
    Ok(script)
}

/// Copies what the guest appended to one of the command's output files since the last call.
struct Tail {
    file: File,
    to: Box<dyn Write>,
}

impl Tail {
    fn pump(&mut self) -> Result<()> {
        let mut buf = Vec::new();
        self.file.read_to_end(&mut buf)?;
        if !buf.is_empty() {
            self.to.write_all(&buf)?;
            self.to.flush()?;
        }
        Ok(())
    }
}

struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn file_name(p: &Path) -> &str {
    p.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// The first file under `dir` (recursively) that `matches`.
fn find(dir: &Path, matches: &dyn Fn(&Path) -> bool) -> Result<Option<PathBuf>> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if let Some(found) = find(&path, matches)? {
                return Ok(Some(found));
            }
        } else if matches(&path) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}
