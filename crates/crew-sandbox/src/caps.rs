//! Resource caps (DESIGN §8c): a cgroup of its own for each start of an agent, its caps
//! written there before the agent runs, and what it used read back when it ended.
//!
//! Two kinds of cgroup, whichever the machine gives crew:
//! - **v2**, where crew's own cgroup is a subtree it may manage with the memory, cpu and pids
//!   controllers (a delegated one: `systemd-run --user --scope -p Delegate=yes crew …`, or a
//!   container's). The kernel lets no cgroup with processes hand controllers to its children,
//!   so crew moves itself into a leaf of its own (`crew-host`) first; each agent gets a sibling.
//! - **v1**, where the memory, cpu and pids hierarchies are mounted and crew's group in each is
//!   writable (root on a machine without v2 controllers): an agent's group is a child of crew's
//!   own in each hierarchy, and cpuacct's, where mounted, measures its CPU time.
//!
//! A start takes a group made ahead of it where one with its caps is ready (a spare, named
//! `crew-spare-<host pid>-<n>`, made by a thread of its own after the start before): making a
//! group and writing its caps costs the kernel a few hundred microseconds, which then stay off
//! the start. A spare is empty and holds exactly the caps it was made with; spares of a host
//! that ended are removed by the next host that looks for cgroups.
//!
//! The warden joins the groups before it starts the agent (it writes its own pid to each
//! `cgroup.procs` it was given open), so everything the agent starts is in them from its first
//! instruction. The files are beneath `/sys/fs/cgroup`, which a confined agent cannot write.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, mpsc};

use crew_core::config::Resources;
use crew_core::model::ResourceUsage;

/// The controllers a capped agent needs.
const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// How spare groups are named: the host's pid and a count follow.
const SPARE_PREFIX: &str = "crew-spare-";

/// The most spare groups a host keeps ready (one per kind of caps its starts ask for).
const MAX_SPARES: usize = 4;

/// The CPU period caps are written in, in microseconds.
const CPU_PERIOD: u64 = 100_000;

/// Which kind of cgroup crew caps agents with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupKind {
    /// The unified hierarchy, a delegated subtree.
    V2,
    /// The memory, cpu and pids hierarchies of cgroup v1.
    V1,
}

impl CgroupKind {
    /// As `crew sandbox check` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            CgroupKind::V2 => "cgroup v2",
            CgroupKind::V1 => "cgroup v1",
        }
    }
}

/// Where crew makes agents' groups.
#[derive(Debug)]
pub struct Cgroups {
    /// Groups made ahead of the starts that take them, with their caps.
    spares: Mutex<Vec<(Resources, AgentGroup)>>,
    /// The thread that makes spares, told which caps to make one for.
    refill: OnceLock<Mutex<mpsc::Sender<Resources>>>,
    kind: CgroupKind,
    /// v2: the delegated subtree; v1: crew's group in the memory, cpu, pids hierarchies (in
    /// that order), then cpuacct's where mounted.
    bases: Vec<PathBuf>,
    /// v1: which base is cpuacct's, where it is mounted (its own hierarchy, or cpu's where
    /// the two are mounted together, as most v1 systems do).
    cpuacct: Option<usize>,
    /// v1: whether the memory controller accounts swap (`memory.memsw.*`), looked at once.
    memsw: bool,
}

/// Why no cgroup can be had here, with what to do.
pub type NoCgroups = String;

impl Cgroups {
    /// The cgroups this process may cap agents with, or why there are none.
    pub fn find() -> Result<Cgroups, NoCgroups> {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| format!("/proc/self/cgroup cannot be read ({error})"))?;
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|error| format!("/proc/self/mountinfo cannot be read ({error})"))?;
        let v2 = v2_base(&own, &mounts);
        if let Some(base) = &v2
            && delegated(base)
        {
            let found = Cgroups {
                kind: CgroupKind::V2,
                bases: vec![base.clone()],
                cpuacct: None,
                memsw: false,
                spares: Mutex::default(),
                refill: OnceLock::new(),
            };
            found.remove_stale_spares();
            return Ok(found);
        }
        let mut bases = Vec::new();
        for controller in CONTROLLERS {
            match v1_base(&own, &mounts, controller) {
                Some(base) if writable(&base) => bases.push(base),
                _ => return Err(no_cgroups(v2.as_deref(), controller)),
            }
        }
        let cpuacct = match v1_base(&own, &mounts, "cpuacct") {
            // Mounted with cpu: one group serves both.
            Some(base) if base == bases[1] => Some(1),
            Some(base) if writable(&base) => {
                bases.push(base);
                Some(bases.len() - 1)
            }
            _ => None,
        };
        let memsw = bases[0].join("memory.memsw.limit_in_bytes").exists();
        let found = Cgroups {
            kind: CgroupKind::V1,
            bases,
            cpuacct,
            memsw,
            spares: Mutex::default(),
            refill: OnceLock::new(),
        };
        found.remove_stale_spares();
        Ok(found)
    }

    /// A group under caps `caps` for a start named `name`: a spare made ahead with those caps
    /// where one is ready, else one made now; either way another spare of those caps is made
    /// after it, off the start.
    pub fn take(&'static self, name: &str, caps: &Resources) -> std::io::Result<AgentGroup> {
        let spare = {
            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
            spares
                .iter()
                .position(|(made_for, _)| made_for == caps)
                .map(|at| spares.swap_remove(at).1)
        };
        let group = match spare {
            Some(group) => group,
            None => self.create(name, caps)?,
        };
        let refill = self.refill.get_or_init(|| {
            let (send, receive) = mpsc::channel::<Resources>();
            let spawned = std::thread::Builder::new()
                .name("crew-cgroup-spares".to_owned())
                .spawn(move || {
                    static SPARES: AtomicU64 = AtomicU64::new(0);
                    for caps in receive {
                        let name = format!(
                            "{SPARE_PREFIX}{}-{}",
                            std::process::id(),
                            SPARES.fetch_add(1, Ordering::Relaxed)
                        );
                        // A spare that cannot be made is made at the start that wants it.
                        if let Ok(spare) = self.create(&name, &caps) {
                            let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
                            if spares.len() < MAX_SPARES {
                                spares.push((caps, spare));
                            }
                        }
                    }
                });
            // Without the thread (none could be started), every start makes its own group.
            drop(spawned);
            Mutex::new(send)
        });
        // The thread is gone only where it could not start: starts make their own.
        let _ = refill.lock().unwrap_or_else(|e| e.into_inner()).send(*caps);
        Ok(group)
    }

    /// Removes the spares made so far (a host ending): what a later start would have taken.
    pub fn drop_spares(&self) {
        let spares = std::mem::take(&mut *self.spares.lock().unwrap_or_else(|e| e.into_inner()));
        // Each removes its group as it is dropped.
        drop(spares);
    }

    /// Removes the spares of hosts that ended (their pid in the name, no longer alive): empty
    /// groups, left because a process's statics are never dropped.
    fn remove_stale_spares(&self) {
        for base in &self.bases {
            let Ok(entries) = fs::read_dir(base) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(rest) = name
                    .to_str()
                    .and_then(|name| name.strip_prefix(SPARE_PREFIX))
                else {
                    continue;
                };
                let pid = rest
                    .split('-')
                    .next()
                    .and_then(|pid| pid.parse::<i32>().ok());
                let alive = pid
                    .and_then(rustix::process::Pid::from_raw)
                    .is_some_and(|pid| {
                        pid.as_raw_nonzero().get() == std::process::id() as i32
                            || rustix::process::test_kill_process(pid).is_ok()
                    });
                if !alive {
                    // Not empty after all (a process joined it): left, as any group in use.
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
    }

    /// Which kind it is.
    pub fn kind(&self) -> CgroupKind {
        self.kind
    }

    /// A group named `name` under caps `caps`, made now. v2 moves this process into its leaf
    /// first, once.
    pub fn create(&self, name: &str, caps: &Resources) -> std::io::Result<AgentGroup> {
        let dirs: Vec<PathBuf> = self.bases.iter().map(|base| base.join(name)).collect();
        if self.kind == CgroupKind::V2 {
            enable_v2(&self.bases[0])?;
        }
        let group = AgentGroup {
            kind: self.kind,
            dirs,
            cpuacct: self.cpuacct,
            memsw: self.memsw,
        };
        for dir in &group.dirs {
            match fs::create_dir(dir) {
                Ok(()) => {}
                // Left by a start of the same name that could not remove it: reused empty.
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => {
                    return Err(std::io::Error::new(
                        error.kind(),
                        format!("{}: {error}", dir.display()),
                    ));
                }
            }
        }
        group.write_caps(caps)?;
        Ok(group)
    }
}

/// The cgroup of one start of an agent.
#[derive(Debug)]
pub struct AgentGroup {
    kind: CgroupKind,
    dirs: Vec<PathBuf>,
    cpuacct: Option<usize>,
    memsw: bool,
}

impl AgentGroup {
    fn write_caps(&self, caps: &Resources) -> std::io::Result<()> {
        let write = |dir: &Path, file: &str, value: String| -> std::io::Result<()> {
            fs::write(dir.join(file), value.as_bytes()).map_err(|error| {
                std::io::Error::new(
                    error.kind(),
                    format!("{}: {error}", dir.join(file).display()),
                )
            })
        };
        let quota = caps
            .cpus
            .map(|cpus| u64::from(cpus.thousandths()) * CPU_PERIOD / 1000);
        match self.kind {
            CgroupKind::V2 => {
                let dir = &self.dirs[0];
                if let Some(memory) = caps.memory {
                    write(dir, "memory.max", memory.0.to_string())?;
                    // No swap beyond the cap: a cap that swaps takes the machine down slower.
                    if dir.join("memory.swap.max").exists() {
                        write(dir, "memory.swap.max", "0".to_owned())?;
                    }
                }
                if let Some(quota) = quota {
                    write(dir, "cpu.max", format!("{quota} {CPU_PERIOD}"))?;
                }
                if let Some(processes) = caps.processes {
                    write(dir, "pids.max", processes.to_string())?;
                }
            }
            CgroupKind::V1 => {
                let [memory_dir, cpu_dir, pids_dir] = [&self.dirs[0], &self.dirs[1], &self.dirs[2]];
                if let Some(memory) = caps.memory {
                    write(memory_dir, "memory.limit_in_bytes", memory.0.to_string())?;
                    if self.memsw {
                        write(
                            memory_dir,
                            "memory.memsw.limit_in_bytes",
                            memory.0.to_string(),
                        )?;
                    }
                }
                // A new group's period is the kernel's default, CPU_PERIOD: only the quota is
                // written.
                if let Some(quota) = quota {
                    write(cpu_dir, "cpu.cfs_quota_us", quota.to_string())?;
                }
                if let Some(processes) = caps.processes {
                    write(pids_dir, "pids.max", processes.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Each `cgroup.procs` of the group, open for writing: the warden writes its pid to each.
    pub fn procs(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.dirs
            .iter()
            .map(|dir| {
                fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
                    .map(OwnedFd::from)
            })
            .collect()
    }

    /// What reads the group's memory and CPU now, for listings (kept by whoever lists).
    pub fn meter(&self) -> Meter {
        Meter {
            memory: self.dirs[0].join(match self.kind {
                CgroupKind::V2 => "memory.current",
                CgroupKind::V1 => "memory.usage_in_bytes",
            }),
            cpu: match self.kind {
                CgroupKind::V2 => Some(self.dirs[0].join("cpu.stat")),
                CgroupKind::V1 => self.cpuacct.map(|at| self.dirs[at].join("cpuacct.usage")),
            },
        }
    }

    /// What the group used so far.
    pub fn usage(&self) -> ResourceUsage {
        match self.kind {
            CgroupKind::V2 => {
                let dir = &self.dirs[0];
                ResourceUsage {
                    peak_memory: number(&dir.join("memory.peak")).unwrap_or(0),
                    cpu_ms: keyed(&dir.join("cpu.stat"), "usage_usec").unwrap_or(0) / 1000,
                    oom_kills: keyed(&dir.join("memory.events"), "oom_kill").unwrap_or(0),
                    processes_refused: keyed(&dir.join("pids.events"), "max").unwrap_or(0),
                }
            }
            CgroupKind::V1 => ResourceUsage {
                peak_memory: number(&self.dirs[0].join("memory.max_usage_in_bytes")).unwrap_or(0),
                cpu_ms: self.cpuacct.map_or(0, |at| {
                    number(&self.dirs[at].join("cpuacct.usage")).unwrap_or(0) / 1_000_000
                }),
                oom_kills: keyed(&self.dirs[0].join("memory.oom_control"), "oom_kill").unwrap_or(0),
                processes_refused: keyed(&self.dirs[2].join("pids.events"), "max").unwrap_or(0),
            },
        }
    }

    /// Removes the group once nothing lives in it: its processes were killed with the agent,
    /// and the kernel takes a moment to let go of the last.
    pub fn remove(&self) {
        for dir in &self.dirs {
            for _ in 0..50 {
                match fs::remove_dir(dir) {
                    Err(error) if error.raw_os_error() == Some(libc::EBUSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    // Removed, or gone: either way not left behind by this start.
                    _ => break,
                }
            }
        }
    }
}

impl Drop for AgentGroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Reads an agent's cgroup as it goes: its memory and CPU time now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    memory: PathBuf,
    cpu: Option<PathBuf>,
}

impl Meter {
    /// The memory its group holds now, in bytes, and its CPU time so far, in milliseconds;
    /// `None` once the group is gone.
    pub fn now(&self) -> Option<(u64, u64)> {
        let memory = number(&self.memory)?;
        let cpu_ms = match &self.cpu {
            Some(file) if file.ends_with("cpu.stat") => {
                keyed(file, "usage_usec").unwrap_or(0) / 1000
            }
            Some(file) => number(file).unwrap_or(0) / 1_000_000,
            None => 0,
        };
        Some((memory, cpu_ms))
    }
}

/// A file holding one number.
fn number(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The number after `key` in a file of `key value` lines.
fn keyed(path: &Path, key: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

fn writable(dir: &Path) -> bool {
    rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_ok()
}

/// This process's group in the unified hierarchy, where it is mounted.
fn v2_base(own: &str, mounts: &str) -> Option<PathBuf> {
    let path = own.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mount = mounts.lines().find_map(|line| {
        let (fields, after) = line.split_once(" - ")?;
        (after.split(' ').next() == Some("cgroup2")).then(|| fields.split(' ').nth(4))?
    })?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// This process's group in the v1 hierarchy of `controller`, where it is mounted.
fn v1_base(own: &str, mounts: &str, controller: &str) -> Option<PathBuf> {
    let path = own.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|name| name == controller)
            .then_some(path)
    })?;
    let mount = mounts.lines().find_map(|line| {
        let (fields, after) = line.split_once(" - ")?;
        let mut after = after.split(' ');
        if after.next() != Some("cgroup") {
            return None;
        }
        let options = after.nth(1)?;
        options
            .split(',')
            .any(|option| option == controller)
            .then(|| fields.split(' ').nth(4))?
    })?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

/// Whether crew may manage the v2 subtree at `base`: writable, with every controller it needs
/// offered.
fn delegated(base: &Path) -> bool {
    let offered = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let words: Vec<&str> = offered.split_whitespace().collect();
    CONTROLLERS
        .iter()
        .all(|controller| words.contains(controller))
        && writable(base)
        && writable(&base.join("cgroup.subtree_control"))
}

/// Moves this process into the leaf `crew-host` of `base` and hands the controllers to
/// `base`'s children (the kernel refuses that while `base` itself holds processes).
fn enable_v2(base: &Path) -> std::io::Result<()> {
    let wanted = "+memory +cpu +pids";
    let control = base.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control).unwrap_or_default();
    if CONTROLLERS
        .iter()
        .all(|controller| enabled.split_whitespace().any(|word| word == *controller))
    {
        return Ok(());
    }
    let leaf = base.join("crew-host");
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())?;
    fs::write(control, wanted)
}

/// Why no cgroup can be had, and what to do.
fn no_cgroups(v2: Option<&Path>, missing: &str) -> NoCgroups {
    match v2 {
        Some(base) => format!(
            "crew's cgroup {} is not a subtree it may manage (no delegated memory, cpu and pids controllers), and cgroup v1's {missing} hierarchy is not writable: start crew in a delegated cgroup (`systemd-run --user --scope -p Delegate=yes crew run …`)",
            base.display()
        ),
        None => format!(
            "this machine mounts no cgroup v2 and cgroup v1's {missing} hierarchy is not writable to crew: run crew as a user who may write it, or on a machine with cgroup v2"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_found_in_each_hierarchy_where_it_is_mounted() {
        let own = "9:name=systemd:/\n8:pids:/\n4:memory:/jobs/one\n2:cpu,cpuacct:/\n0::/user.slice/crew\n";
        let mounts = "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n\
                      31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                      32 25 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n\
                      33 25 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            v1_base(own, mounts, "memory").unwrap(),
            Path::new("/sys/fs/cgroup/memory/jobs/one")
        );
        assert_eq!(
            v1_base(own, mounts, "cpuacct").unwrap(),
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(v1_base(own, mounts, "blkio"), None);
        assert_eq!(
            v2_base(own, mounts).unwrap(),
            Path::new("/sys/fs/cgroup/unified/user.slice/crew")
        );
    }
}
