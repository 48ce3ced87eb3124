//! `get`: tables of objects, one object, or a watch of them (`-w`).

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::Args;
use corral_api::kinds::{
    ConfigSpec, PodStatus, RevealedSecret, SecretSpec, VM_HEADERS, job_columns,
    load_balancer_columns, per_node_columns, vm_columns,
};
use corral_api::{Kind, Object};

use super::connect;
use crate::output::{Format, Table, age, print_structured};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral get pods                         the pods in namespace default
  corral get pods -A -l app=web -o wide   every namespace, by label, with addresses
  corral get pod/web -o yaml              one object in full
  corral get pods -w                      then a line whenever a pod's row changes
  corral get pods --sort-by restarts      by a column: name, age, status, restarts, …
  corral get all -n team-a                every namespaced kind in team-a
  corral get secret/db                    its keys and sizes, never the values
  corral get secret/db --reveal           the values (needs the right to read them)")]
pub struct GetArgs {
    /// KIND, KIND/NAME or KIND NAME (pod, pods, pod/web, pd, vm, node, …),
    /// or `all` for every namespaced kind.
    target: String,
    name: Option<String>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// Only objects whose labels match, e.g. `app=web,tier!=db`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    selector: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
    /// After the list, print a line each time an object's row changes
    /// (`-o json`: each changed object), until interrupted.
    #[arg(short = 'w', long)]
    watch: bool,
    /// Order the rows by a column of the table (NAME, REVISION, AGE,
    /// STATUS, RESTARTS, NODE, …; any case); numbers and ages sort as such.
    #[arg(long, value_name = "COLUMN")]
    sort_by: Option<String>,
    /// With one Secret: print its values (`KEY: VALUE`, binary values as
    /// base64) instead of their sizes. Operators, users whose token has
    /// --read-secrets, and controllers that declare they read them.
    #[arg(long, conflicts_with = "watch")]
    reveal: bool,
}

pub async fn get(config: Option<PathBuf>, args: GetArgs) -> anyhow::Result<()> {
    if args.target.eq_ignore_ascii_case("all") {
        return get_all(config, args).await;
    }
    let target = Target::parse(&args.target, args.name.as_deref())?;
    let client = connect(config)?;
    if args.watch {
        let watch = super::get_watch::Watch {
            kind: target.kind,
            namespace: (!args.all_namespaces && target.kind.is_namespaced())
                .then_some(args.namespace.as_str()),
            name: target.name.as_deref(),
            selector: args.selector.as_deref(),
            output: args.output,
            show_namespace: args.all_namespaces && target.kind.is_namespaced(),
        };
        return watch.run(&client).await;
    }
    if args.reveal {
        let key = target.key(Some(&args.namespace))?;
        if key.kind != Kind::Secret || target.name.is_none() {
            anyhow::bail!("--reveal shows one Secret's values: corral get secret/NAME --reveal");
        }
        let revealed = client.reveal(&key, None).await?;
        if !print_structured(args.output, &revealed)? {
            print_revealed(&revealed);
        }
        return Ok(());
    }
    if target.name.is_some() {
        let object = client.get(&target.key(Some(&args.namespace))?).await?;
        if !print_structured(args.output, &object)? {
            print_table(target.kind, &[object], false, args.output == Format::Wide);
        }
        return Ok(());
    }
    let namespace = (!args.all_namespaces).then_some(args.namespace.as_str());
    let mut list = client
        .list(target.kind, namespace, args.selector.as_deref())
        .await?;
    if let Some(column) = &args.sort_by {
        sort_by(&mut list.items, column, args.output == Format::Wide)?;
    }
    if !print_structured(args.output, &list)? {
        if list.items.is_empty() {
            eprintln!("no {} found", target.kind.plural());
        } else {
            let show_namespace = args.all_namespaces && target.kind.is_namespaced();
            print_table(
                target.kind,
                &list.items,
                show_namespace,
                args.output == Format::Wide,
            );
        }
    }
    Ok(())
}

/// `KEY: VALUE` per key: text as it is, anything else as base64.
fn print_revealed(revealed: &RevealedSecret) {
    use base64::Engine;
    for (key, encoded) in &revealed.data {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap_or_default();
        match String::from_utf8(bytes) {
            Ok(text)
                if !text
                    .chars()
                    .any(|c| c.is_control() && c != '\n' && c != '\t') =>
            {
                println!("{key}: {text}");
            }
            _ => println!("{key} (base64): {encoded}"),
        }
    }
}

/// `get all`: a table per namespaced kind that has objects, named
/// `KIND/NAME` like kubectl.
async fn get_all(config: Option<PathBuf>, args: GetArgs) -> anyhow::Result<()> {
    if args.name.is_some() || args.watch {
        anyhow::bail!("`get all` lists every namespaced kind: give no name and no --watch");
    }
    let client = connect(config)?;
    let namespace = (!args.all_namespaces).then_some(args.namespace.as_str());
    let mut items = Vec::new();
    let mut printed = false;
    for kind in Kind::ALL.into_iter().filter(|k| k.is_namespaced()) {
        let mut list = client
            .list(kind, namespace, args.selector.as_deref())
            .await?;
        if list.items.is_empty() {
            continue;
        }
        if let Some(column) = &args.sort_by {
            sort_by(&mut list.items, column, args.output == Format::Wide)?;
        }
        if matches!(args.output, Format::Json | Format::Yaml) {
            items.extend(list.items);
            continue;
        }
        if printed {
            println!();
        }
        let mut table = table(
            kind,
            &list.items,
            args.all_namespaces,
            args.output == Format::Wide,
        );
        table.prefix_names(kind.short(), usize::from(args.all_namespaces));
        table.print();
        printed = true;
    }
    if matches!(args.output, Format::Json | Format::Yaml) {
        print_structured(args.output, &serde_json::json!({ "items": items }))?;
    } else if !printed {
        eprintln!("nothing found");
    }
    Ok(())
}

/// Sorts objects by the table column named `column` (any case): numerically
/// when every value is a number, by creation time for AGE.
fn sort_by(objects: &mut [Object], column: &str, wide: bool) -> anyhow::Result<()> {
    let Some(kind) = objects.first().map(|o| o.kind) else {
        return Ok(());
    };
    let headers = headers(kind, false, wide);
    let Some(index) = headers.iter().position(|h| h.eq_ignore_ascii_case(column)) else {
        anyhow::bail!(
            "--sort-by {column}: {} tables have the columns {}",
            kind.short(),
            headers.join(", ")
        );
    };
    if headers[index] == "AGE" {
        objects.sort_by_key(|o| std::cmp::Reverse(o.metadata.created_at));
        return Ok(());
    }
    let now = Utc::now();
    let mut keyed: Vec<(String, Object)> = objects
        .iter()
        .map(|o| (row(o, false, wide, now)[index].clone(), o.clone()))
        .collect();
    let numeric = keyed.iter().all(|(value, _)| value.parse::<f64>().is_ok());
    keyed.sort_by(|(a, _), (b, _)| {
        if numeric {
            let (a, b) = (
                a.parse::<f64>().unwrap_or(0.0),
                b.parse::<f64>().unwrap_or(0.0),
            );
            a.total_cmp(&b)
        } else {
            a.cmp(b)
        }
    });
    for (slot, (_, object)) in objects.iter_mut().zip(keyed) {
        *slot = object;
    }
    Ok(())
}

fn print_table(kind: Kind, objects: &[Object], show_namespace: bool, wide: bool) {
    table(kind, objects, show_namespace, wide).print();
}

/// The table `get` prints: a header row, then a row per object.
pub(super) fn table(kind: Kind, objects: &[Object], show_namespace: bool, wide: bool) -> Table {
    let now = Utc::now();
    let mut table = Table::new(&headers(kind, show_namespace, wide));
    for object in objects {
        table.row(row(object, show_namespace, wide, now));
    }
    table
}

fn headers(kind: Kind, show_namespace: bool, wide: bool) -> Vec<&'static str> {
    let mut headers = Vec::new();
    if show_namespace {
        headers.push("NAMESPACE");
    }
    headers.extend(["NAME", "REVISION"]);
    match kind {
        Kind::Pod => {
            headers.extend(["STATUS", "READY", "RESTARTS", "NODE"]);
            if wide {
                headers.push("ADDRESS");
            }
        }
        Kind::LoadBalancer => headers.extend(["ADDRESSES", "PORTS", "READY"]),
        Kind::Secret => headers.extend(["TYPE", "KEYS"]),
        Kind::Config => headers.push("KEYS"),
        Kind::Job => headers.extend(["STATUS", "COMPLETIONS", "ACTIVE", "FAILED"]),
        Kind::PerNodeDeployment => headers.extend(["DESIRED", "CURRENT", "READY"]),
        Kind::VirtualMachine => headers.extend(VM_HEADERS),
        _ => {}
    }
    if wide {
        headers.extend(["OWNER", "UID"]);
    }
    headers.push("AGE");
    headers
}

/// An object's row; AGE is its last cell.
pub(super) fn row(
    object: &Object,
    show_namespace: bool,
    wide: bool,
    now: DateTime<Utc>,
) -> Vec<String> {
    let kind = object.kind;
    let mut row = Vec::new();
    if show_namespace {
        row.push(object.metadata.namespace.clone().unwrap_or_default());
    }
    row.push(object.metadata.name.clone());
    row.push(object.metadata.revision.to_string());
    if kind == Kind::Pod {
        let status: PodStatus = object.typed_status().unwrap_or_default();
        row.push(corral_api::kinds::pod_status_word(object));
        row.push(status.ready_count());
        row.push(status.restarts().to_string());
        row.push(status.node.clone().unwrap_or_else(|| "-".into()));
        if wide {
            row.push(status.address.clone().unwrap_or_else(|| "-".into()));
        }
    }
    if kind == Kind::LoadBalancer {
        row.extend(load_balancer_columns(object));
    }
    if kind == Kind::Secret {
        let spec: SecretSpec = object.typed_spec().unwrap_or_default();
        row.push(spec.secret_type.unwrap_or_else(|| "-".into()));
        let keys: Vec<String> = spec
            .keys
            .iter()
            .map(|(key, info)| format!("{key} ({} B)", info.size))
            .collect();
        row.push(list_or_dash(&keys));
    }
    if kind == Kind::Config {
        let spec: ConfigSpec = object.typed_spec().unwrap_or_default();
        let keys: Vec<String> = spec.data.keys().cloned().collect();
        row.push(list_or_dash(&keys));
    }
    if kind == Kind::Job {
        row.extend(job_columns(object));
    }
    if kind == Kind::PerNodeDeployment {
        row.extend(per_node_columns(object));
    }
    if kind == Kind::VirtualMachine {
        row.extend(vm_columns(object));
    }
    if wide {
        row.push(owner_cell(object));
        row.push(object.metadata.uid.clone());
    }
    row.push(age(object.metadata.created_at, now));
    row
}

/// The OWNER cell: `pd/web`, or `-`.
fn owner_cell(object: &Object) -> String {
    object
        .metadata
        .owner
        .as_ref()
        .map_or_else(|| "-".into(), ToString::to_string)
}

fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}
