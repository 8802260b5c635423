//! The kernel's keyrings, closed to confined agents.
//!
//! Keyrings are not confined by a namespace, nor by Landlock: an agent inherits its host's
//! session keyring and possesses what is in it (Kerberos tickets, file-system encryption keys,
//! tokens a login put there), and may reach by its number any key or keyring its user may read
//! or link (the user's own keyrings are the user's to read). So confined agents are started
//! under a seccomp filter under which the three system calls of the keyrings (`add_key`,
//! `keyctl`, `request_key`) fail with `EPERM`, for them and everything they start, in the
//! machine's own system call numbering and in the other one a process of this architecture can
//! call the kernel in (i386 and x32 on x86_64, arm on aarch64). Every other system call is
//! left as it is. The filter is installed once, on the thread their wardens are started from
//! (`crate::spawn::Spawner`), and inherited from there: the kernel compiles a filter at each
//! install, which cost 40 to 100 µs a process here.

use libc::sock_filter;

/// An architecture as seccomp names it (`AUDIT_ARCH_*`), and its numbers of the keyrings'
/// system calls.
struct Numbering {
    arch: u32,
    calls: &'static [u32],
}

/// `__X32_SYSCALL_BIT`: x32 programs call the x86_64 kernel with it set.
#[cfg(target_arch = "x86_64")]
const X32: u32 = 0x4000_0000;

/// `add_key`, `request_key`, `keyctl`: 248, 249, 250 on x86_64 (and x32), 286, 287, 288 as
/// i386 numbers them.
#[cfg(target_arch = "x86_64")]
const NUMBERINGS: [Numbering; 2] = [
    Numbering {
        arch: 0xC000_003E,
        calls: &[248, 249, 250, X32 | 248, X32 | 249, X32 | 250],
    },
    Numbering {
        arch: 0x4000_0003,
        calls: &[286, 287, 288],
    },
];

/// `add_key`, `request_key`, `keyctl`: 217, 218, 219 on aarch64, 309, 310, 311 as arm
/// numbers them.
#[cfg(target_arch = "aarch64")]
const NUMBERINGS: [Numbering; 2] = [
    Numbering {
        arch: 0xC000_00B7,
        calls: &[217, 218, 219],
    },
    Numbering {
        arch: 0x4000_0028,
        calls: &[309, 310, 311],
    },
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "crew's sandbox closes the kernel's keyrings by their system call numbers, which it knows for x86_64 and aarch64 only"
);

// The machine's own numbers are the C library's.
const _: () = assert!(
    NUMBERINGS[0].calls[0] == libc::SYS_add_key as u32
        && NUMBERINGS[0].calls[1] == libc::SYS_request_key as u32
        && NUMBERINGS[0].calls[2] == libc::SYS_keyctl as u32
);

/// Where `struct seccomp_data` holds the system call's number, and its architecture.
const NUMBER_AT: u32 = 0;
const ARCH_AT: u32 = 4;

/// The filter's length: per numbering, a load of the architecture, its test, a load of the
/// number, a test per call and an allow; then the allow of any other architecture and the
/// refusal.
const LENGTH: usize = {
    let mut length = 2;
    let mut at = 0;
    while at < NUMBERINGS.len() {
        length += NUMBERINGS[at].calls.len() + 4;
        at += 1;
    }
    length
};

const fn instruction(code: u32, k: u32, jt: usize, jf: usize) -> sock_filter {
    assert!(jt <= u8::MAX as usize && jf <= u8::MAX as usize);
    sock_filter {
        code: code as u16,
        jt: jt as u8,
        jf: jf as u8,
        k,
    }
}

const fn load(offset: u32) -> sock_filter {
    instruction(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset, 0, 0)
}

/// Skips `jt` instructions when the accumulator is `k`, else `jf`.
const fn test(k: u32, jt: usize, jf: usize) -> sock_filter {
    instruction(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, k, jt, jf)
}

const fn answer(value: u32) -> sock_filter {
    instruction(libc::BPF_RET | libc::BPF_K, value, 0, 0)
}

/// The filter, built once by the compiler.
static FILTER: [sock_filter; LENGTH] = {
    let allow = answer(libc::SECCOMP_RET_ALLOW);
    let mut filter = [allow; LENGTH];
    let refusal = LENGTH - 1;
    filter[refusal] = answer(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
    let mut at = 0;
    let mut numbering = 0;
    while numbering < NUMBERINGS.len() {
        let calls = NUMBERINGS[numbering].calls;
        filter[at] = load(ARCH_AT);
        // Another architecture: on to the next numbering, past this one's load, tests and
        // allow.
        filter[at + 1] = test(NUMBERINGS[numbering].arch, 0, calls.len() + 2);
        filter[at + 2] = load(NUMBER_AT);
        at += 3;
        let mut call = 0;
        while call < calls.len() {
            filter[at] = test(calls[call], refusal - at - 1, 0);
            at += 1;
            call += 1;
        }
        // `filter[at]`, this numbering's allow, is already there.
        at += 1;
        numbering += 1;
    }
    filter
};

/// Closes the keyrings to the calling thread and everything it starts from now on (its other
/// threads are left as they are): no new privileges (what an unprivileged user needs to
/// install a filter, and what a confined agent gets anyway), then the filter.
/// Async-signal-safe: two system calls on a static filter.
pub fn close_keyrings() -> std::io::Result<()> {
    if crate::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) != 0 {
        return Err(std::io::Error::from_raw_os_error(crate::sys::errno()));
    }
    let program = libc::sock_fprog {
        len: LENGTH as u16,
        filter: FILTER.as_ptr().cast_mut(),
    };
    if crate::sys::seccomp_filter(&program) == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(crate::sys::errno()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child of its own: `keyctl` before and after the filter, and a system call the
    /// filter leaves alone.
    #[test]
    fn under_the_filter_the_keyrings_refuse_and_everything_else_answers() {
        const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
        const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
        let keyring = || {
            // SAFETY: asks for the session keyring's number; no memory is passed.
            let id = unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    KEYCTL_GET_KEYRING_ID,
                    KEY_SPEC_SESSION_KEYRING,
                    0,
                )
            };
            (id, crate::sys::errno())
        };
        // SAFETY: the child makes system calls only, then exits.
        let works = unsafe {
            super::super::enter::child_succeeds(|| {
                let (before, error_before) = keyring();
                let confined = close_keyrings().is_ok();
                let (after, error) = keyring();
                (before > 0 || error_before != libc::EPERM)
                    && confined
                    && after == -1
                    && error == libc::EPERM
                    && compat_keyctl_refused()
                    // A filter refusing everything would refuse this too.
                    && crate::sys::getpid() > 0
            })
        };
        assert!(
            works,
            "keyctl answered before the filter and refused under it"
        );
    }

    /// `keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING)` as an i386 program calls it
    /// (`int 0x80`, number 288), which a 64-bit process may do too: refused as well.
    #[cfg(target_arch = "x86_64")]
    fn compat_keyctl_refused() -> bool {
        let mut answer: i64 = 288;
        // SAFETY: a system call by the i386 entry with integer arguments only; it reads and
        // writes no memory of this process. That entry clobbers r8 to r11; rbx (its first
        // argument, which LLVM keeps for itself) is swapped in and back.
        unsafe {
            std::arch::asm!(
                "xchg {first}, rbx",
                "int 0x80",
                "xchg {first}, rbx",
                first = inout(reg) 0i64 => _,
                inout("rax") answer,
                in("rcx") -3i64,
                in("rdx") 0i64,
                out("r8") _,
                out("r9") _,
                out("r10") _,
                out("r11") _,
            );
        }
        answer == -i64::from(libc::EPERM)
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn compat_keyctl_refused() -> bool {
        true
    }
}
