//! Which instruction set the CPU kernels run with.
//!
//! By default the best one the CPU has (AVX-512, else AVX2, else the
//! baseline), detected once. The environment variable `PMSTATE_CPU_ISA`
//! (`avx512`, `avx2`, `scalar` or `auto`), read once on the first kernel
//! call, or [`select`] before it (what `pmstate bench --isa` does) forces
//! one, to measure the paths other CPUs take. An instruction set the CPU
//! lacks is never run: [`select`] returns an error, and the kernels panic on
//! their first call if `PMSTATE_CPU_ISA` names one (or names nothing known).
//! Every instruction set gives the same bits (see `cpu`).

use std::fmt;
use std::sync::OnceLock;

/// The environment variable that forces an instruction set.
pub const ENV: &str = "PMSTATE_CPU_ISA";

/// An instruction set the CPU kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86_64): no runtime feature needed.
    Scalar,
    /// x86_64 AVX2 + FMA: 16 registers of 4 f64.
    Avx2,
    /// x86_64 AVX-512 F + VL (with AVX2 + FMA): 32 registers of 8 f64.
    Avx512,
}

/// An instruction set that cannot be used: unknown, missing on this CPU,
/// or asked for after the kernels started with another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IsaError {
    /// A name that is none of `avx512`, `avx2`, `scalar`.
    #[error("unknown CPU instruction set '{name}': expected avx512, avx2, scalar or auto")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// An instruction set this CPU lacks.
    #[error("this CPU does not support the {isa} instruction set (best available: {best})")]
    Unsupported {
        /// The one asked for.
        isa: Isa,
        /// The best this CPU has.
        best: Isa,
    },
    /// [`select`] after the kernels fixed their instruction set.
    #[error("the CPU kernels already run with {running}: select the instruction set before the first kernel call")]
    AlreadySelected {
        /// The one in use.
        running: Isa,
    },
    /// `PMSTATE_CPU_ISA` asks for an instruction set that cannot be used.
    #[error("{ENV}={value}: {problem}")]
    Env {
        /// The variable's value.
        value: String,
        /// Why it cannot be used ([`IsaError::Unknown`] or [`IsaError::Unsupported`]).
        problem: Box<IsaError>,
    },
    /// `PMSTATE_CPU_ISA` is not valid UTF-8.
    #[error("{ENV}={value}: not valid UTF-8")]
    EnvNotUnicode {
        /// The value, its invalid bytes replaced.
        value: String,
    },
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Isa {
    /// Every instruction set, best last.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// The name `PMSTATE_CPU_ISA` and `pmstate bench --isa` use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The instruction set of a name (`scalar`, `avx2`, `avx512`).
    pub fn parse(name: &str) -> Result<Isa, IsaError> {
        let lower = name.trim().to_ascii_lowercase();
        Isa::ALL.into_iter().find(|i| i.name() == lower).ok_or_else(|| IsaError::Unknown { name: name.to_owned() })
    }

    /// Whether this CPU has every feature the kernels of this instruction
    /// set are compiled with (`is_x86_feature_detected!`, cached by std).
    #[inline]
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported() && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// `self` if this CPU supports it, else an error naming it.
    pub fn require(self) -> Result<Isa, IsaError> {
        if self.is_supported() {
            Ok(self)
        } else {
            Err(IsaError::Unsupported { isa: self, best: best() })
        }
    }
}

/// The best instruction set this CPU supports.
pub fn best() -> Isa {
    Isa::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Scalar)
}

/// The instruction set a value of `PMSTATE_CPU_ISA` asks for: unset, empty
/// or `auto` is the best one; anything else must name a supported one.
pub fn resolve(env: Option<&str>) -> Result<Isa, IsaError> {
    match env.map(str::trim) {
        None | Some("") => Ok(best()),
        Some(s) if s.eq_ignore_ascii_case("auto") => Ok(best()),
        Some(s) => Isa::parse(s)
            .and_then(Isa::require)
            .map_err(|problem| IsaError::Env { value: s.to_owned(), problem: Box::new(problem) }),
    }
}

fn from_env() -> Result<Isa, IsaError> {
    match std::env::var(ENV) {
        Ok(v) => resolve(Some(&v)),
        Err(std::env::VarError::NotPresent) => resolve(None),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(IsaError::EnvNotUnicode { value: v.to_string_lossy().into_owned() })
        }
    }
}

static SELECTED: OnceLock<Isa> = OnceLock::new();

/// The instruction set the kernels run with, fixed on the first call.
///
/// # Panics
/// If `PMSTATE_CPU_ISA` is set to an unknown name or to an instruction set
/// this CPU lacks (and [`select`] was not called first).
#[inline]
pub fn current() -> Isa {
    *SELECTED.get_or_init(|| from_env().unwrap_or_else(|e| panic!("{e}")))
}

/// [`current`] without its panic: the instruction set the kernels run
/// with, fixed now (from `PMSTATE_CPU_ISA`, default the best) if nothing
/// fixed it yet; an error if that variable names an unknown instruction
/// set or one this CPU lacks.
pub fn try_current() -> Result<Isa, IsaError> {
    if let Some(isa) = SELECTED.get() {
        return Ok(*isa);
    }
    let want = from_env()?;
    Ok(*SELECTED.get_or_init(|| want))
}

/// Fixes the instruction set before the first kernel call: `Some(isa)` (an
/// error if this CPU lacks it), or `None` for what `PMSTATE_CPU_ISA` asks
/// (default: the best). Returns the one in use; an error if the kernels
/// already run with another.
pub fn select(choice: Option<Isa>) -> Result<Isa, IsaError> {
    let want = match choice {
        Some(isa) => isa.require()?,
        None => from_env()?,
    };
    let got = *SELECTED.get_or_init(|| want);
    if got != want {
        return Err(IsaError::AlreadySelected { running: got });
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Ok(isa));
            assert_eq!(Isa::parse(&isa.name().to_uppercase()), Ok(isa));
        }
        assert_eq!(Isa::parse("sse9"), Err(IsaError::Unknown { name: "sse9".into() }));
        let e = resolve(Some(" sse9 ")).unwrap_err();
        let unknown = Box::new(IsaError::Unknown { name: "sse9".into() });
        assert_eq!(e, IsaError::Env { value: "sse9".into(), problem: unknown });
        // The one wording check: the variable, its value and what it may be.
        assert_eq!(
            e.to_string(),
            "PMSTATE_CPU_ISA=sse9: unknown CPU instruction set 'sse9': expected avx512, avx2, scalar or auto"
        );
    }

    #[test]
    fn resolve_never_picks_an_unsupported_isa() {
        assert_eq!(resolve(None), Ok(best()));
        assert_eq!(resolve(Some("")), Ok(best()));
        assert_eq!(resolve(Some("Auto")), Ok(best()));
        assert!(best().is_supported());
        assert_eq!(resolve(Some("scalar")), Ok(Isa::Scalar));
        for isa in Isa::ALL {
            assert_eq!(resolve(Some(isa.name())).is_ok(), isa.is_supported(), "{isa}");
            assert_eq!(isa.require().is_ok(), isa.is_supported(), "{isa}");
            if !isa.is_supported() {
                assert_eq!(isa.require(), Err(IsaError::Unsupported { isa, best: best() }));
            }
        }
    }

    #[test]
    fn avx512_implies_avx2() {
        assert!(!Isa::Avx512.is_supported() || Isa::Avx2.is_supported());
    }
}
