//! What the warden finds in `/proc`, with raw system calls over stack buffers only
//! (async-signal-safe: a sweep runs in a signal handler): processes carrying the agent's
//! marker, and its own children.

use std::ffi::CStr;

use crate::sys;

/// Sends SIGKILL to every process but this one whose environment holds `marker` as a whole
/// entry; returns how many were signalled. Async-signal-safe, like [`for_each_pid`].
pub(super) fn sweep_marked(marker: &[u8]) -> usize {
    let own_pid = sys::getpid();
    let mut killed = 0;
    for_each_pid(|pid| {
        if pid != own_pid && environ_holds(pid, marker) && sys::kill(pid, libc::SIGKILL) == 0 {
            killed += 1;
        }
    });
    killed
}

/// Kills every live child of this process (with the warden a subreaper, every process the
/// agent left behind ends up its child) and returns how many there were. Async-signal-safe.
pub(super) fn kill_children() -> usize {
    let own_pid = sys::getpid();
    let mut killed = 0;
    for_each_pid(|pid| {
        if let Some((state, parent)) = state_and_parent(pid)
            && parent == own_pid
            && state != b'Z'
            && sys::kill(pid, libc::SIGKILL) == 0
        {
            killed += 1;
        }
    });
    killed
}

/// Calls `visit` with the pid of every process in `/proc`. Async-signal-safe: raw `open`,
/// `getdents64` and `close` over a stack buffer, no allocation, no panicking index.
pub(super) fn for_each_pid(mut visit: impl FnMut(libc::pid_t)) {
    let proc_dir = sys::open(
        c"/proc",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    );
    if proc_dir < 0 {
        return;
    }
    let mut entries = [0u8; 4096];
    loop {
        let filled = sys::getdents64(proc_dir, &mut entries);
        if filled <= 0 {
            break;
        }
        let filled = &entries[..(filled as usize).min(entries.len())];
        let mut offset = 0;
        // Each record: inode (8 bytes), offset (8), record length (2), type (1), name.
        while let Some(record) = filled.get(offset..) {
            let Some(&[low, high]) = record.get(16..18) else {
                break;
            };
            let length = u16::from_ne_bytes([low, high]) as usize;
            if length == 0 {
                break;
            }
            if let Some(pid) = record.get(19..length.min(record.len())).and_then(parse_pid) {
                visit(pid);
            }
            offset += length;
        }
    }
    sys::close(proc_dir);
}

/// The state letter and parent pid of `pid`, from `/proc/<pid>/stat` (`pid (comm) S ppid …`;
/// the command name may hold spaces and parentheses, so the last `)` ends it).
/// Async-signal-safe.
pub(super) fn state_and_parent(pid: libc::pid_t) -> Option<(u8, libc::pid_t)> {
    let mut path = [0u8; 32];
    proc_path(pid, b"/stat\0", &mut path);
    let mut buffer = [0u8; 512];
    let file = sys::open(proc_cstr(&path)?, libc::O_RDONLY | libc::O_CLOEXEC);
    if file < 0 {
        return None;
    }
    let read = sys::read(file, &mut buffer);
    sys::close(file);
    let stat = buffer.get(..usize::try_from(read).ok()?)?;
    let after_name = stat.iter().rposition(|&byte| byte == b')')?;
    // ") S 1234 …"
    let rest = stat.get(after_name + 2..)?;
    let state = *rest.first()?;
    let digits = rest.get(2..)?;
    let end = digits.iter().position(|&byte| byte == b' ')?;
    let parent = parse_pid(digits.get(..end)?)?;
    Some((state, parent))
}

/// A path [`proc_path`] wrote, as the C string it is (up to its first NUL).
pub(super) fn proc_cstr(path: &[u8; 32]) -> Option<&CStr> {
    CStr::from_bytes_until_nul(path).ok()
}

/// Writes `/proc/<pid><suffix>` into `path`; `suffix` ends with a NUL.
pub(super) fn proc_path(pid: libc::pid_t, suffix: &[u8], path: &mut [u8; 32]) {
    const PREFIX: &[u8] = b"/proc/";
    let mut digits = [0u8; 10];
    let digits = decimal(pid.unsigned_abs(), &mut digits);
    for (slot, &byte) in path
        .iter_mut()
        .zip(PREFIX.iter().chain(digits).chain(suffix))
    {
        *slot = byte;
    }
}

/// `value` in decimal, in `digits`: what code between fork and exec writes numbers with (it
/// allocates nothing).
pub fn decimal(value: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut start = digits.len();
    let mut rest = value;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    &digits[start..]
}

/// The number a `/proc` entry names (its name up to the first NUL), if it is all digits: a
/// pid there, a pid or a descriptor in the warden's arguments.
pub(super) fn parse_pid(name: &[u8]) -> Option<libc::pid_t> {
    let digits = name.split(|&byte| byte == 0).next()?;
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    let mut pid: libc::pid_t = 0;
    for &digit in digits {
        if !digit.is_ascii_digit() {
            return None;
        }
        pid = pid * 10 + libc::pid_t::from(digit - b'0');
    }
    Some(pid)
}

/// Whether `/proc/<pid>/environ` holds `marker` as a whole entry, read in chunks: the
/// signal-handler twin of [`crate::procscan::carries_marker`], which allocates.
pub(super) fn environ_holds(pid: libc::pid_t, marker: &[u8]) -> bool {
    let mut path = [0u8; 32];
    proc_path(pid, b"/environ\0", &mut path);
    let Some(path) = proc_cstr(&path) else {
        return false;
    };
    let file = sys::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
    if file < 0 {
        return false;
    }
    let mut matcher = EntryMatcher::new(marker);
    let mut chunk = [0u8; 4096];
    let mut found = false;
    loop {
        let read = sys::read(file, &mut chunk);
        if read <= 0 {
            found = found || matcher.finish();
            break;
        }
        if chunk[..(read as usize).min(chunk.len())]
            .iter()
            .any(|&byte| matcher.feed(byte))
        {
            found = true;
            break;
        }
    }
    sys::close(file);
    found
}

/// Finds `marker` as a whole NUL-separated entry in a stream of bytes, one byte at a time.
pub(super) struct EntryMatcher<'a> {
    marker: &'a [u8],
    matched: usize,
    /// Whether the entry read so far is still a prefix of the marker.
    matching: bool,
}

impl<'a> EntryMatcher<'a> {
    pub(super) fn new(marker: &'a [u8]) -> Self {
        EntryMatcher {
            marker,
            matched: 0,
            matching: true,
        }
    }

    /// Takes the next byte; true when it ends an entry equal to the marker.
    pub(super) fn feed(&mut self, byte: u8) -> bool {
        if byte == 0 {
            let found = self.finish();
            self.matched = 0;
            self.matching = true;
            return found;
        }
        if self.matching && self.marker.get(self.matched) == Some(&byte) {
            self.matched += 1;
        } else {
            self.matching = false;
        }
        false
    }

    /// Whether the entry read so far (at the end of the stream) equals the marker.
    pub(super) fn finish(&self) -> bool {
        self.matching && !self.marker.is_empty() && self.matched == self.marker.len()
    }
}
