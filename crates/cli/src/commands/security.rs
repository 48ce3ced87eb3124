//! `explain-security`: the effective sandbox of a pod and where each
//! relaxation came from, computed by the same rule the server admits with.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use corral_api::Kind;
use corral_api::kinds::{PodSpec, PolicySpec};
use corral_api::security::{EffectiveSandbox, admit_pod};

use super::connect;
use crate::output::{Format, Table, print_structured};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral explain-security pod/web                 every sandbox knob and the Policy that relaxed it
  corral explain-security web -n team-a -o json   a pod NAME alone works too")]
pub struct ExplainSecurityArgs {
    /// The pod: pod/NAME or NAME.
    target: String,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn explain_security(
    config: Option<PathBuf>,
    args: ExplainSecurityArgs,
) -> anyhow::Result<()> {
    let target = if args.target.contains('/') {
        Target::parse(&args.target, None)?
    } else {
        Target::parse("pod", Some(&args.target))?
    };
    if target.kind != Kind::Pod {
        bail!(
            "explain-security explains pods; {} is a {}",
            args.target,
            target.kind
        );
    }
    let client = connect(config)?;
    let key = target.key(Some(&args.namespace))?;
    let pod = client.get(&key).await?;
    let spec: PodSpec = pod
        .typed_spec()
        .with_context(|| format!("{key} has a spec that is not a pod spec"))?;
    let policies: Vec<(String, PolicySpec)> = client
        .list(Kind::Policy, None, None)
        .await?
        .items
        .iter()
        .filter_map(|policy| Some((policy.metadata.name.clone(), policy.typed_spec().ok()?)))
        .collect();
    let sandbox = admit_pod(&key.namespace, &spec, &policies)
        .map_err(|refusal| anyhow::anyhow!("{key} would not be admitted now: {refusal}"))?;
    if !print_structured(args.output, &sandbox)? {
        print!("{}", render(&sandbox));
    }
    Ok(())
}

/// The sandbox as a table of knobs, then the grants nobody asked for.
fn render(sandbox: &EffectiveSandbox) -> String {
    let mut table = Table::new(&["KNOB", "VALUE", "SOURCE"]);
    for knob in &sandbox.knobs {
        table.row(vec![knob.name.clone(), knob.value.clone(), knob.source()]);
    }
    let mut out = table.render();
    for unused in &sandbox.unused_grants {
        out.push_str(&format!("note: {unused}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_api::security::admit;

    #[test]
    fn renders_each_knob_with_its_source() {
        let policies = vec![(
            "root".to_string(),
            PolicySpec {
                namespaces: vec!["team-a".into()],
                grant: vec!["run-as-root".into(), "host-network".into()],
                default_runtime: None,
            },
        )];
        let sandbox = admit("team-a", &["run-as-root".to_string()], &policies).expect("granted");
        let text = render(&sandbox);
        let uid = text
            .lines()
            .find(|l| l.starts_with("uid"))
            .expect("uid row");
        assert!(
            uid.contains("root (0)") && uid.ends_with("relaxed by Policy root (run-as-root)"),
            "{text}"
        );
        let seccomp = text
            .lines()
            .find(|l| l.starts_with("seccomp"))
            .expect("seccomp row");
        assert!(seccomp.ends_with("default"), "{text}");
        assert!(text.contains("note: Policy root grants host-network to namespace team-a but the pod does not ask for it"), "{text}");
    }
}
