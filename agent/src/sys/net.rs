//! Network interface ioctls (netdevice(7), route(7)): link flags, IPv4 address and netmask,
//! default route. No netlink library: these five ioctls are all the agent needs, and the static
//! binary stays small.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// linux/sockios.h
const SIOCADDRT: libc::c_ulong = 0x890B;
const SIOCGIFFLAGS: libc::c_ulong = 0x8913;
const SIOCSIFFLAGS: libc::c_ulong = 0x8914;
const SIOCSIFADDR: libc::c_ulong = 0x8916;
const SIOCSIFNETMASK: libc::c_ulong = 0x891C;

/// An AF_INET datagram socket: the handle the interface ioctls go through.
fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the returned fd is checked and then owned.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

fn sockaddr_in(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) on Linux; the kernel reads
    // the generic sockaddr as a sockaddr_in because sin_family is AF_INET.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(sock: &OwnedFd, request: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: callers pass a pointer to the struct type the request expects (ifreq or rtentry),
    // valid and writable for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, arg) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets IFF_UP on (or off) for `name`.
pub fn set_link_up(name: &str, up: bool) -> io::Result<()> {
    let sock = control_socket()?;
    let mut req = ifreq_for(name)?;
    ioctl(&sock, SIOCGIFFLAGS, (&raw mut req).cast())?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let iff_up = libc::IFF_UP as libc::c_short;
    req.ifr_ifru.ifru_flags = if up { flags | iff_up } else { flags & !iff_up };
    ioctl(&sock, SIOCSIFFLAGS, (&raw mut req).cast())
}

/// Gives `name` the address `ip` with netmask `mask` (SIOCSIFADDR, then SIOCSIFNETMASK).
pub fn set_ipv4_address(name: &str, ip: Ipv4Addr, mask: Ipv4Addr) -> io::Result<()> {
    let sock = control_socket()?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(ip);
    ioctl(&sock, SIOCSIFADDR, (&raw mut req).cast())?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_in(mask);
    ioctl(&sock, SIOCSIFNETMASK, (&raw mut req).cast())
}

/// Adds `default via gateway dev name` (SIOCADDRT); an existing default route is kept (EEXIST).
pub fn add_default_route(name: &str, gateway: Ipv4Addr) -> io::Result<()> {
    let sock = control_socket()?;
    let mut dev: Vec<libc::c_char> = name.bytes().map(|b| b as libc::c_char).collect();
    dev.push(0);
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr_in(gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    route.rt_dev = dev.as_mut_ptr();
    match ioctl(&sock, SIOCADDRT, (&raw mut route).cast()) {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        other => other,
    }
}
