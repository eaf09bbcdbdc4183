//! `cargo xtask dist`: what a deploy needs, built on this machine, offline: the static runner
//! binary, its container image and, with `--redis-image`, a Redis image made from this
//! machine's redis-server (for compose where no registry is reachable). It says everything it
//! lacks before it builds anything.
//!
//! - `target/dist/eggtimer`: the static (musl) runner, stripped (no C library needed at all).
//! - `eggtimer:<version>`: an image from scratch around it and the sample plugins
//!   (`ops/container/Containerfile`), built with `$CONTAINER`, else podman, else docker.
//! - `eggtimer-redis:<version of redis-server>`: redis-server and the libraries it links, from
//!   scratch.
//!
//! `--no-image` builds the binary alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::{build_plugins, cargo, on_path, root, target_dir};

const MUSL: &str = "x86_64-unknown-linux-musl";

/// The sample plugins the image carries.
const IMAGE_PLUGINS: [&str; 4] = ["auto-feed", "coupon-expiry", "order-cancel", "webhook"];

struct Wants {
    image: bool,
    redis_image: bool,
}

/// What the machine has that a dist build needs.
struct Has {
    musl_target: bool,
    musl_gcc: bool,
    strip: bool,
    container: Option<String>,
    /// Container tools installed that don't answer (`docker` without its daemon).
    not_answering: Vec<String>,
    redis_server: bool,
}

impl Has {
    fn here() -> Has {
        let tools: Vec<String> = match std::env::var("CONTAINER") {
            Ok(c) => vec![c],
            Err(_) => vec!["podman".into(), "docker".into()],
        };
        let installed: Vec<String> = tools.into_iter().filter(|c| on_path(c)).collect();
        let answers = |c: &String| {
            Command::new(c)
                .arg("info")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let container = installed.iter().find(|c| answers(c)).cloned();
        Has {
            musl_target: installed_targets().iter().any(|t| t == MUSL),
            musl_gcc: on_path("musl-gcc"),
            strip: on_path("strip"),
            not_answering: match container {
                Some(_) => Vec::new(),
                None => installed,
            },
            container,
            redis_server: on_path("redis-server"),
        }
    }

    /// What is missing for `wants`, each with how to get it.
    fn missing(&self, wants: &Wants) -> Vec<String> {
        let mut m = Vec::new();
        if !self.musl_target {
            m.push(format!("the musl target: `rustup target add {MUSL}`"));
        }
        if !self.musl_gcc {
            m.push(
                "a musl C compiler (mimalloc and ring are C): `sudo apt-get install -y musl-tools`"
                    .into(),
            );
        }
        if !self.strip {
            m.push("`strip`: `sudo apt-get install -y binutils`".into());
        }
        if (wants.image || wants.redis_image) && self.container.is_none() {
            let tried = match self.not_answering.as_slice() {
                [] => String::new(),
                some => format!(
                    " ({} is installed but `info` fails: is its daemon running?)",
                    some.join(", ")
                ),
            };
            m.push(format!(
                "podman or docker for the images: `sudo apt-get install -y podman`{tried} (or \
                 `--no-image` for the binary alone)"
            ));
        }
        if wants.redis_image && !self.redis_server {
            m.push(
                "redis-server, which the Redis image is made of: `sudo apt-get install -y \
                 redis-server`"
                    .into(),
            );
        }
        m
    }
}

fn installed_targets() -> Vec<String> {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.trim().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn dist(args: &[String]) -> Result<()> {
    let wants = Wants {
        image: !args.iter().any(|a| a == "--no-image"),
        redis_image: args.iter().any(|a| a == "--redis-image"),
    };
    if let Some(a) = args
        .iter()
        .find(|a| !matches!(a.as_str(), "--no-image" | "--redis-image"))
    {
        bail!("cargo xtask dist takes --no-image and --redis-image, not {a:?}");
    }
    let has = Has::here();
    let missing = has.missing(&wants);
    if !missing.is_empty() {
        bail!(
            "cargo xtask dist needs, before it starts:\n  - {}",
            missing.join("\n  - ")
        );
    }
    let started = Instant::now();
    cargo(
        &[
            "build",
            "--release",
            "--locked",
            "--target",
            MUSL,
            "-p",
            "eggtimer",
        ],
        None,
        &[],
    )?;
    let out = target_dir().join("dist");
    std::fs::create_dir_all(&out)?;
    let bin = out.join("eggtimer");
    // without the debug info a release build keeps for backtraces (~200 MB -> ~40 MB)
    run(Command::new("strip")
        .arg("-o")
        .arg(&bin)
        .arg(target_dir().join(MUSL).join("release/eggtimer")))?;
    eprintln!(
        "xtask: {} (static), built in {} min {} s",
        bin.display(),
        started.elapsed().as_secs() / 60,
        started.elapsed().as_secs() % 60
    );
    let Some(tool) = has.container.filter(|_| wants.image || wants.redis_image) else {
        return Ok(());
    };
    if wants.image {
        let plugins = build_plugins()?;
        let stage = fresh_stage(&out.join("image"))?;
        std::fs::create_dir_all(stage.join("rootfs/plugins"))?;
        std::fs::create_dir_all(stage.join("rootfs/data"))?;
        std::fs::copy(&bin, stage.join("rootfs/eggtimer"))?;
        for p in IMAGE_PLUGINS {
            let f = format!("{p}.wasm");
            std::fs::copy(plugins.join(&f), stage.join("rootfs/plugins").join(&f))?;
        }
        let tag = format!("eggtimer:{}", runner_version()?);
        build_image(
            &tool,
            &tag,
            &stage,
            &root().join("ops/container/Containerfile"),
        )?;
    }
    if wants.redis_image {
        let stage = fresh_stage(&out.join("redis-image"))?;
        let version = stage_redis(&stage.join("rootfs"))?;
        let tag = format!("eggtimer-redis:{version}");
        build_image(
            &tool,
            &tag,
            &stage,
            &root().join("ops/container/Containerfile.redis"),
        )?;
        eprintln!("xtask: for compose: REDIS_IMAGE={tag}");
    }
    eprintln!(
        "xtask: dist done in {} min {} s",
        started.elapsed().as_secs() / 60,
        started.elapsed().as_secs() % 60
    );
    Ok(())
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{:?} failed ({status})", cmd.get_program());
    }
    Ok(())
}

fn fresh_stage(dir: &Path) -> Result<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    Ok(dir.to_path_buf())
}

fn build_image(tool: &str, tag: &str, stage: &Path, containerfile: &Path) -> Result<()> {
    std::fs::copy(containerfile, stage.join("Containerfile"))?;
    run(Command::new(tool)
        .args(["build", "-t", tag, "-f"])
        .arg(stage.join("Containerfile"))
        .arg(stage))?;
    eprintln!("xtask: built the image {tag} ({tool})");
    Ok(())
}

/// The runner's version (runner/Cargo.toml).
fn runner_version() -> Result<String> {
    let toml = std::fs::read_to_string(root().join("runner/Cargo.toml"))?;
    toml.lines()
        .find_map(|l| l.strip_prefix("version = \"")?.strip_suffix('"'))
        .map(str::to_owned)
        .context("runner/Cargo.toml names no version")
}

/// Copies this machine's redis-server, the libraries it links and their loader into `rootfs`
/// (their paths kept); returns its version.
fn stage_redis(rootfs: &Path) -> Result<String> {
    let server = which("redis-server")?;
    let mut files = vec![server.clone()];
    let ldd = Command::new("ldd")
        .arg(&server)
        .output()
        .context("running ldd")?;
    files.extend(linked_files(&String::from_utf8_lossy(&ldd.stdout)));
    for f in &files {
        // a symlink's target, under the link's name
        let to = rootfs.join(f.strip_prefix("/").unwrap_or(f));
        std::fs::create_dir_all(to.parent().expect("a file's directory"))?;
        std::fs::copy(f, &to).with_context(|| format!("copying {}", f.display()))?;
    }
    std::fs::create_dir_all(rootfs.join("data"))?;
    std::fs::create_dir_all(rootfs.join("usr/bin"))?;
    if server != Path::new("/usr/bin/redis-server") {
        std::fs::copy(&server, rootfs.join("usr/bin/redis-server"))?;
    }
    let v = Command::new(&server).arg("--version").output()?;
    let v = String::from_utf8_lossy(&v.stdout);
    v.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .map(str::to_owned)
        .context("redis-server --version names no version")
}

/// The files an `ldd` listing names (`libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and
/// the loader's own line).
fn linked_files(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|l| {
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

fn which(program: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|f| f.is_file())
        })
        .with_context(|| format!("{program} is not on PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_missing_is_said_at_once_with_how_to_get_it() {
        let none = Has {
            musl_target: false,
            musl_gcc: false,
            strip: true,
            container: None,
            not_answering: vec!["docker".into()],
            redis_server: false,
        };
        let all = Wants {
            image: true,
            redis_image: true,
        };
        let m = none.missing(&all).join("\n");
        for want in [
            "rustup target add x86_64-unknown-linux-musl",
            "apt-get install -y musl-tools",
            "apt-get install -y podman",
            "apt-get install -y redis-server",
            "docker is installed but `info` fails",
        ] {
            assert!(m.contains(want), "{want} in {m}");
        }
        assert!(!m.contains("binutils"));
        let binary_only = Wants {
            image: false,
            redis_image: false,
        };
        assert_eq!(none.missing(&binary_only).len(), 2);
    }

    #[test]
    fn the_libraries_an_ldd_listing_names() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibssl.so.3 => /lib/x86_64-linux-gnu/libssl.so.3 (0x00007f1)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n";
        assert_eq!(
            linked_files(ldd),
            [
                "/lib/x86_64-linux-gnu/libssl.so.3",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
    }
}
